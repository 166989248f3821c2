package ociimage_test

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/model-orchestra/operator/internal/ociimage"
)

// fakeBinary writes a file standing in for a static binary.
func fakeBinary(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "orchestra-gateway")
	if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestPackWritesAnImportableImage(t *testing.T) {
	bin := fakeBinary(t, "#!binary")
	extra := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(extra, []byte("port: 8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "images", "gateway.tar")
	ref := "ghcr.io/model-orchestra/orchestra-gateway:v0.1.0"
	digest, err := ociimage.Pack(ociimage.Options{
		Binary: bin,
		Ref:    ref,
		Out:    out,
		Args:   []string{"--config=/etc/gateway/config.yaml"},
		Ports:  []string{"8080", "9090/tcp"},
		Files:  map[string]string{"/etc/gateway/config.yaml": extra, "/usr/libexec/helper": fakeBinary(t, "#!helper")},
	})
	if err != nil {
		t.Fatal(err)
	}

	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(out, &tag)
	if err != nil {
		t.Fatalf("reading the tarball back by its tag: %v", err)
	}
	if got, err := img.Digest(); err != nil || got != digest {
		t.Errorf("digest = %v (%v), Pack returned %v", got, err, digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("platform = %s/%s, want linux/amd64", cfg.OS, cfg.Architecture)
	}
	if cfg.Config.User != "65532:65532" {
		t.Errorf("user = %q, want non-root 65532:65532", cfg.Config.User)
	}
	if diff := cmp.Diff([]string{"/orchestra-gateway"}, cfg.Config.Entrypoint); diff != "" {
		t.Errorf("entrypoint (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"--config=/etc/gateway/config.yaml"}, cfg.Config.Cmd); diff != "" {
		t.Errorf("cmd (-want +got):\n%s", diff)
	}
	wantPorts := map[string]struct{}{"8080/tcp": {}, "9090/tcp": {}}
	if diff := cmp.Diff(wantPorts, cfg.Config.ExposedPorts); diff != "" {
		t.Errorf("exposed ports (-want +got):\n%s", diff)
	}
	if cfg.Created.Unix() != 0 {
		t.Errorf("created = %v, want the Unix epoch for reproducibility", cfg.Created)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 {
		t.Fatalf("image has %d layers, want 1 (no base image)", len(layers))
	}
	files := map[string]*tar.Header{}
	contents := map[string]string{}
	rc := mutate.Extract(img)
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[hdr.Name] = hdr
		data, _ := io.ReadAll(tr)
		contents[hdr.Name] = string(data)
	}
	if h := files["orchestra-gateway"]; h == nil || h.Mode&0o111 == 0 {
		t.Errorf("binary missing or not executable: %+v", h)
	} else if contents["orchestra-gateway"] != "#!binary" {
		t.Errorf("binary content = %q", contents["orchestra-gateway"])
	}
	if contents["etc/gateway/config.yaml"] != "port: 8080\n" {
		t.Errorf("extra file content = %q", contents["etc/gateway/config.yaml"])
	}
	if h := files["etc/gateway/config.yaml"]; h == nil || h.Mode&0o004 == 0 || h.Mode&0o111 != 0 {
		t.Errorf("extra file is not world-readable, or is executable: %+v", h)
	}
	if h := files["usr/libexec/helper"]; h == nil || h.Mode&0o111 != 0o111 {
		t.Errorf("an executable extra file is not executable in the image: %+v", h)
	}
	if h := files["tmp"]; h == nil || h.Mode&0o1777 != 0o1777 {
		t.Errorf("/tmp missing or not sticky and world-writable: %+v", h)
	}
	for n := range files {
		if n == "bin" || n == "bin/sh" {
			t.Errorf("image has %s; want no shell", n)
		}
	}
}

func TestPackIsReproducible(t *testing.T) {
	bin := fakeBinary(t, "same bytes")
	opts := ociimage.Options{Binary: bin, Ref: "localhost/repro:v1"}
	opts.Out = filepath.Join(t.TempDir(), "a.tar")
	first, err := ociimage.Pack(opts)
	if err != nil {
		t.Fatal(err)
	}
	// A later modification time must not change the image.
	if err := os.Chtimes(bin, time.Now(), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	opts.Out = filepath.Join(t.TempDir(), "b.tar")
	second, err := ociimage.Pack(opts)
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Errorf("digests differ: %s vs %s", first, second)
	}
}

func TestPackRejectsBadOptions(t *testing.T) {
	bin := fakeBinary(t, "x")
	out := filepath.Join(t.TempDir(), "x.tar")
	for name, opts := range map[string]ociimage.Options{
		"no binary":      {Ref: "localhost/x:v1", Out: out},
		"no ref":         {Binary: bin, Out: out},
		"bad ref":        {Binary: bin, Ref: "UPPER/Case:v1", Out: out},
		"named user":     {Binary: bin, Ref: "localhost/x:v1", Out: out, User: "nobody"},
		"bad port":       {Binary: bin, Ref: "localhost/x:v1", Out: out, Ports: []string{"http"}},
		"relative file":  {Binary: bin, Ref: "localhost/x:v1", Out: out, Files: map[string]string{"etc/x": bin}},
		"missing binary": {Binary: bin + ".missing", Ref: "localhost/x:v1", Out: out},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ociimage.Pack(opts); err == nil {
				t.Fatal("Pack succeeded, want an error")
			}
			if _, err := os.Stat(out); err == nil {
				t.Error("Pack left an output file behind after failing")
			}
		})
	}
}
