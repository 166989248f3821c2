package watches

import (
	"bytes"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/ignore"
)

// LoadChart loads the chart at name inside fsys. name is either a chart
// directory (holding Chart.yaml) or a packaged chart ending in .tgz. A
// directory's .helmignore is honoured as by `helm package`.
func LoadChart(fsys fs.FS, name string) (*chart.Chart, error) {
	name = path.Clean(strings.TrimPrefix(name, "./"))
	fi, err := fs.Stat(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("chart %q: %w", name, err)
	}
	if !fi.IsDir() {
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("reading chart archive %q: %w", name, err)
		}
		c, err := loader.LoadArchive(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("loading chart archive %q: %w", name, err)
		}
		return c, nil
	}
	if _, err := fs.Stat(fsys, path.Join(name, "Chart.yaml")); err != nil {
		return nil, fmt.Errorf("chart %q has no Chart.yaml: %w", name, err)
	}

	rules := ignore.Empty()
	if data, err := fs.ReadFile(fsys, path.Join(name, ".helmignore")); err == nil {
		if rules, err = ignore.Parse(bytes.NewReader(data)); err != nil {
			return nil, fmt.Errorf("parsing %s/.helmignore: %w", name, err)
		}
	}
	rules.AddDefaults()

	var files []*loader.BufferedFile
	err = fs.WalkDir(fsys, name, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, name), "/")
		if rel == "" {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rules.Ignore(rel, info) {
				return fs.SkipDir
			}
			return nil
		}
		if rules.Ignore(rel, info) {
			return nil
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		files = append(files, &loader.BufferedFile{Name: rel, Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading chart %q: %w", name, err)
	}
	c, err := loader.LoadFiles(files)
	if err != nil {
		return nil, fmt.Errorf("loading chart %q: %w", name, err)
	}
	return c, nil
}
