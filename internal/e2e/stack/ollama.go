package stack

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// ImageRef returns the reference an image tarball of `make images` is
// tagged with (its docker-archive manifest's first RepoTag): the demo and
// the tests give it to runtime.image, so that they run exactly what was
// built.
func ImageRef(tarball string) (string, error) {
	f, err := os.Open(tarball)
	if err != nil {
		return "", fmt.Errorf("the image tarball (make images builds it): %w", err)
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("%s has no manifest.json: not a docker-archive tarball", tarball)
		}
		if err != nil {
			return "", fmt.Errorf("reading %s: %w", tarball, err)
		}
		if h.Name != "manifest.json" {
			continue
		}
		var m []struct {
			RepoTags []string `json:"RepoTags"`
		}
		if err := json.NewDecoder(tr).Decode(&m); err != nil {
			return "", fmt.Errorf("decoding the manifest of %s: %w", tarball, err)
		}
		if len(m) == 0 || len(m[0].RepoTags) == 0 {
			return "", fmt.Errorf("the image in %s has no tag", tarball)
		}
		return m[0].RepoTags[0], nil
	}
}
