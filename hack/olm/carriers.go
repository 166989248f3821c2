package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/blang/semver/v4"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/bundle"
)

// carrierList is catalog/carriers.yaml: the CRD carriers to generate.
type carrierList struct {
	Carriers []carrierSpec `json:"carriers"`
}

// carrierSpec is one CRD carrier: the patch release Version of the line
// whose last release is Replaces (a bundle in catalog/bundles/).
type carrierSpec struct {
	Version  string `json:"version"`
	Replaces string `json:"replaces"`
}

func loadCarriers(src catalogSources) ([]carrierSpec, error) {
	if src.carriers == "" {
		return nil, nil
	}
	data, err := os.ReadFile(filepath.Join(src.root, src.carriers))
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l carrierList
	if err := yaml.UnmarshalStrict(data, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", src.carriers, err)
	}
	for _, c := range l.Carriers {
		if _, err := semver.Parse(c.Version); err != nil {
			return nil, fmt.Errorf("%s: version %q: %w", src.carriers, c.Version, err)
		}
	}
	return l.Carriers, nil
}

// carrierDirs lists the generated carriers' bundle directories.
func carrierDirs(src catalogSources) []string {
	list, err := loadCarriers(src)
	if err != nil {
		return nil // writeCarriers, which runs first, reports it
	}
	var out []string
	for _, c := range list {
		out = append(out, filepath.Join(src.root, src.carrierDir, c.Version))
	}
	return out
}

// writeCarriers generates every carrier of catalog/carriers.yaml from its
// line's last release and the current bundle's CRDs, and removes carrier
// directories no longer listed. It returns the directories written.
func writeCarriers(src catalogSources) ([]string, error) {
	list, err := loadCarriers(src)
	if err != nil {
		return nil, err
	}
	current, err := bundle.Load(filepath.Join(src.root, src.current))
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(src.root, src.carrierDir)
	keep := map[string]bool{}
	var written []string
	for _, c := range list {
		from, err := bundle.Load(filepath.Join(src.root, src.history, c.Replaces))
		if err != nil {
			return nil, fmt.Errorf("carrier %s replaces %s: %w", c.Version, c.Replaces, err)
		}
		b, err := bundle.Carrier(from, current, c.Version)
		if err != nil {
			return nil, err
		}
		out := filepath.Join(dir, c.Version)
		if err := b.Write(out); err != nil {
			return nil, err
		}
		keep[c.Version] = true
		rel, _ := filepath.Rel(src.root, out)
		written = append(written, rel)
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && !keep[e.Name()] {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				return nil, err
			}
		}
	}
	return written, nil
}
