// Package bundle generates, writes, loads and validates the operator's OLM
// registry+v1 bundle: a ClusterServiceVersion, the CRDs it owns and the
// metadata/annotations.yaml that names the package and channels.
package bundle

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	"os"
	"path/filepath"
	"sort"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// File is one manifest file of a bundle, as it is (or will be) on disk.
type File struct {
	// Name is the file name inside manifests/.
	Name string
	// Data is the file content.
	Data []byte
}

// Bundle is a registry+v1 bundle in memory.
type Bundle struct {
	CSV         *v1alpha1.ClusterServiceVersion
	CRDs        []*apiextv1.CustomResourceDefinition
	Others      []*unstructured.Unstructured
	Files       []File
	Annotations manifest.BundleAnnotations
}

// Package returns the package name from the annotations.
func (b *Bundle) Package() string { return b.Annotations.Annotations[manifest.AnnotationPackage] }

// ErrNotABundle is returned by Load when a directory lacks the registry+v1
// layout (manifests/ and metadata/annotations.yaml).
var ErrNotABundle = errors.New("not a registry+v1 bundle directory")

// Load reads a bundle directory. It fails on what makes a bundle unusable
// (missing layout, unparsable files, not exactly one CSV); everything else
// is left to Validate.
func Load(dir string) (*Bundle, error) {
	for _, sub := range []string{"manifests", "metadata"} {
		st, err := os.Stat(filepath.Join(dir, sub))
		if err != nil || !st.IsDir() {
			return nil, fmt.Errorf("%w: %s has no %s/ directory", ErrNotABundle, dir, sub)
		}
	}
	annData, err := os.ReadFile(filepath.Join(dir, "metadata", "annotations.yaml"))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotABundle, err)
	}
	b := &Bundle{}
	if err := yaml.UnmarshalStrict(annData, &b.Annotations); err != nil {
		return nil, fmt.Errorf("parsing %s/metadata/annotations.yaml: %w", dir, err)
	}
	files, err := manifest.YAMLFiles(filepath.Join(dir, "manifests"), false)
	if err != nil {
		return nil, fmt.Errorf("listing %s/manifests: %w", dir, err)
	}
	for _, path := range files {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		b.Files = append(b.Files, File{Name: filepath.Base(path), Data: data})
	}
	if err := b.decodeFiles(); err != nil {
		return nil, fmt.Errorf("loading bundle %s: %w", dir, err)
	}
	return b, nil
}

// decodeFiles fills CSV, CRDs and Others from Files.
func (b *Bundle) decodeFiles() error {
	b.CSV, b.CRDs, b.Others = nil, nil, nil
	for _, f := range b.Files {
		docs, err := manifest.Documents(f.Data)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Name, err)
		}
		for _, doc := range docs {
			objs, err := manifest.Objects(doc)
			if err != nil {
				return fmt.Errorf("%s: %w", f.Name, err)
			}
			u := objs[0]
			switch u.GetKind() {
			case v1alpha1.ClusterServiceVersionKind:
				if b.CSV != nil {
					return fmt.Errorf("%s: more than one ClusterServiceVersion in the bundle", f.Name)
				}
				csv := &v1alpha1.ClusterServiceVersion{}
				if err := yaml.UnmarshalStrict(doc, csv); err != nil {
					return fmt.Errorf("%s: decoding ClusterServiceVersion: %w", f.Name, err)
				}
				b.CSV = csv
			case "CustomResourceDefinition":
				crd := &apiextv1.CustomResourceDefinition{}
				if err := yaml.Unmarshal(doc, crd); err != nil {
					return fmt.Errorf("%s: decoding CustomResourceDefinition: %w", f.Name, err)
				}
				b.CRDs = append(b.CRDs, crd)
			default:
				b.Others = append(b.Others, u)
			}
		}
	}
	if b.CSV == nil {
		return errors.New("no ClusterServiceVersion in manifests/")
	}
	return nil
}

// Write writes the bundle to dir (manifests/ and metadata/), replacing
// whatever those two directories held so that no stale file survives.
func (b *Bundle) Write(dir string) error {
	for _, sub := range []string{"manifests", "metadata"} {
		if err := os.RemoveAll(filepath.Join(dir, sub)); err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	for _, f := range b.Files {
		if err := os.WriteFile(filepath.Join(dir, "manifests", f.Name), f.Data, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, "metadata", "annotations.yaml"), AnnotationsYAML(b.Annotations), 0o644)
}

// AnnotationsYAML renders metadata/annotations.yaml with keys in a stable,
// conventional order.
func AnnotationsYAML(a manifest.BundleAnnotations) []byte {
	var buf bytes.Buffer
	buf.WriteString("annotations:\n")
	for _, k := range a.SortedKeys() {
		fmt.Fprintf(&buf, "  %s: %s\n", k, quoteYAML(a.Annotations[k]))
	}
	return buf.Bytes()
}

// Dockerfile renders the bundle image Dockerfile. contextDir is the bundle
// directory relative to the Docker build context (for example "bundle").
// Its LABELs repeat annotations.yaml, as operator-sdk writes them.
func Dockerfile(a manifest.BundleAnnotations, contextDir string) []byte {
	var buf bytes.Buffer
	buf.WriteString("# Generated by `go run ./hack/olm bundle`; do not edit.\n")
	buf.WriteString("FROM scratch\n\n")
	buf.WriteString("# Core bundle labels, identical to metadata/annotations.yaml.\n")
	for _, k := range a.SortedKeys() {
		fmt.Fprintf(&buf, "LABEL %s=%s\n", k, a.Annotations[k])
	}
	buf.WriteString("\n# Copy files to locations specified by labels.\n")
	fmt.Fprintf(&buf, "COPY %s/manifests /manifests/\n", strings.TrimSuffix(contextDir, "/"))
	fmt.Fprintf(&buf, "COPY %s/metadata /metadata/\n", strings.TrimSuffix(contextDir, "/"))
	return buf.Bytes()
}

// quoteYAML quotes a scalar with sigs.k8s.io/yaml so that values such as
// "manifests/" or "1.0" stay strings.
func quoteYAML(s string) string {
	out, err := yaml.Marshal(s)
	if err != nil {
		return fmt.Sprintf("%q", s)
	}
	return strings.TrimSuffix(string(out), "\n")
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
