package catalog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// ErrNoSchema is returned by Load for a document without a schema.
var ErrNoSchema = errors.New("document has no schema")

// Load reads every .yaml, .yml and .json file under dir (recursively),
// honouring .indexignore files (one glob per line, relative to the
// directory holding the file), as opm's loader does.
func Load(dir string) (*DeclarativeConfig, error) {
	cfg := &DeclarativeConfig{}
	var ignores []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			data, err := os.ReadFile(filepath.Join(path, ".indexignore"))
			if err == nil {
				for _, line := range strings.Split(string(data), "\n") {
					if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
						ignores = append(ignores, filepath.Join(path, line))
					}
				}
			}
			return nil
		}
		for _, g := range ignores {
			if ok, _ := filepath.Match(g, path); ok {
				return nil
			}
		}
		switch strings.ToLower(filepath.Ext(path)) {
		case ".yaml", ".yml", ".json":
		default:
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if err := cfg.decode(data); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// decode adds every document of a YAML or JSON stream.
func (c *DeclarativeConfig) decode(data []byte) error {
	docs, err := manifest.Documents(data)
	if err != nil {
		return err
	}
	for i, doc := range docs {
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		var head struct {
			Schema  string `json:"schema"`
			Package string `json:"package"`
			Name    string `json:"name"`
		}
		if err := json.Unmarshal(js, &head); err != nil {
			return fmt.Errorf("document %d: %w", i+1, err)
		}
		strict := func(v any) error {
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			if err := dec.Decode(v); err != nil {
				return fmt.Errorf("document %d (%s %q): %w", i+1, head.Schema, head.Name, err)
			}
			return nil
		}
		switch head.Schema {
		case "":
			return fmt.Errorf("document %d: %w", i+1, ErrNoSchema)
		case SchemaPackage:
			var p Package
			if err := strict(&p); err != nil {
				return err
			}
			c.Packages = append(c.Packages, p)
		case SchemaChannel:
			var ch Channel
			if err := strict(&ch); err != nil {
				return err
			}
			c.Channels = append(c.Channels, ch)
		case SchemaBundle:
			var b Bundle
			if err := strict(&b); err != nil {
				return err
			}
			c.Bundles = append(c.Bundles, b)
		default:
			c.Others = append(c.Others, Meta{Schema: head.Schema, Package: head.Package, Name: head.Name, Blob: js})
		}
	}
	return nil
}

// YAML writes the catalog as one YAML stream, in a fixed order: per package
// (by name) the olm.package, its channels by name, its bundles by version,
// then other documents. The same catalog always gives the same bytes.
func (c *DeclarativeConfig) YAML() ([]byte, error) {
	var buf bytes.Buffer
	write := func(v any) error {
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		buf.WriteString("---\n")
		buf.Write(data)
		return nil
	}
	pkgs := append([]Package(nil), c.Packages...)
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Name < pkgs[j].Name })
	for _, p := range pkgs {
		if err := write(p); err != nil {
			return nil, err
		}
		var chans []Channel
		for _, ch := range c.Channels {
			if ch.Package == p.Name {
				chans = append(chans, ch)
			}
		}
		sort.Slice(chans, func(i, j int) bool { return chans[i].Name < chans[j].Name })
		for _, ch := range chans {
			if err := write(ch); err != nil {
				return nil, err
			}
		}
		var bundles []Bundle
		for _, b := range c.Bundles {
			if b.Package == p.Name {
				bundles = append(bundles, b)
			}
		}
		sort.Slice(bundles, func(i, j int) bool { return bundleLess(bundles[i], bundles[j]) })
		for _, b := range bundles {
			if err := write(b); err != nil {
				return nil, err
			}
		}
	}
	others := append([]Meta(nil), c.Others...)
	sort.Slice(others, func(i, j int) bool {
		if others[i].Schema != others[j].Schema {
			return others[i].Schema < others[j].Schema
		}
		return others[i].Package+"/"+others[i].Name < others[j].Package+"/"+others[j].Name
	})
	for _, o := range others {
		data, err := yaml.JSONToYAML(o.Blob)
		if err != nil {
			return nil, err
		}
		buf.WriteString("---\n")
		buf.Write(data)
	}
	return buf.Bytes(), nil
}

// bundleLess orders bundles by version, then name.
func bundleLess(a, b Bundle) bool {
	va, ea := bundleVersion(a)
	vb, eb := bundleVersion(b)
	if ea == nil && eb == nil && !va.EQ(vb) {
		return va.LT(vb)
	}
	return a.Name < b.Name
}

func bundleVersion(b Bundle) (semver.Version, error) {
	pp, err := packageProperties(b)
	if err != nil || len(pp) != 1 {
		return semver.Version{}, fmt.Errorf("bundle %s: want exactly one olm.package property", b.Name)
	}
	return semver.Parse(pp[0].Version)
}
