package bundle

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ScanChartKinds lists the kinds a chart's templates can render, by reading
// each template's top-level apiVersion and kind lines. Rendering the samples
// only shows the kinds the samples switch on; a kind behind a condition no
// sample meets (an optional HTTPRoute, say) would otherwise be missing from
// the operator's permissions, and the operator would fail the first time a
// user turned it on. Lines whose value is a template expression are
// reported in unresolved.
//
// templatesDir is a chart's templates directory, or a chart directory:
// then its templates and those of its subcharts (charts/*/templates) are
// read, and nothing else (values files hold no objects).
func ScanChartKinds(templatesDir string) (kinds []schema.GroupVersionKind, unresolved []string, err error) {
	seen := map[schema.GroupVersionKind]bool{}
	err = filepath.WalkDir(templatesDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml", ".tpl":
		default:
			return nil
		}
		if !inTemplates(templatesDir, path) {
			return nil // values, CI values, Chart.yaml
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		apiVersion := ""
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 1024*1024), 1024*1024)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), " \t")
			switch {
			case strings.HasPrefix(line, "---"):
				apiVersion = ""
			case strings.HasPrefix(line, "apiVersion:"):
				apiVersion = unquote(strings.TrimSpace(strings.TrimPrefix(line, "apiVersion:")))
			case strings.HasPrefix(line, "kind:") && apiVersion != "":
				kind := unquote(strings.TrimSpace(strings.TrimPrefix(line, "kind:")))
				rel, _ := filepath.Rel(templatesDir, path)
				if strings.Contains(apiVersion, "{{") || strings.Contains(kind, "{{") {
					unresolved = append(unresolved, rel+": "+apiVersion+" "+kind)
					apiVersion = ""
					continue
				}
				gv, err := schema.ParseGroupVersion(apiVersion)
				if err != nil {
					unresolved = append(unresolved, rel+": "+apiVersion+" "+kind)
					apiVersion = ""
					continue
				}
				gvk := gv.WithKind(kind)
				if !seen[gvk] {
					seen[gvk] = true
					kinds = append(kinds, gvk)
				}
				apiVersion = ""
			}
		}
		return sc.Err()
	})
	sort.Slice(kinds, func(i, j int) bool { return kinds[i].String() < kinds[j].String() })
	return kinds, unresolved, err
}

// inTemplates tells whether path, a file under root, is a template: root
// is a templates directory, or path is in one below root.
func inTemplates(root, path string) bool {
	if filepath.Base(filepath.Clean(root)) == "templates" {
		return true
	}
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return false
	}
	for _, elem := range strings.Split(filepath.ToSlash(rel), "/") {
		if elem == "templates" {
			return true
		}
	}
	return false
}

func unquote(s string) string {
	return strings.Trim(s, `"'`)
}

// kindObjects turns kinds into empty objects, for DeriveRules.
func kindObjects(kinds []schema.GroupVersionKind) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(kinds))
	for _, k := range kinds {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(k)
		u.SetName("chart-template")
		out = append(out, u)
	}
	return out
}
