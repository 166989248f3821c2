package manifest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestObjectsSkipsBlankDocumentsAndNeedsKind(t *testing.T) {
	stream := "# leading comment\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n---\n# only a comment\n---\n{\"apiVersion\": \"v1\", \"kind\": \"Secret\", \"metadata\": {\"name\": \"b\"}}\n"
	objs, err := Objects([]byte(stream))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind()+"/"+o.GetName())
	}
	if d := cmp.Diff([]string{"ConfigMap/a", "Secret/b"}, got); d != "" {
		t.Errorf("objects (-want +got):\n%s", d)
	}
	if _, err := Objects([]byte("metadata:\n  name: x\n")); err == nil || !strings.Contains(err.Error(), "apiVersion and kind are required") {
		t.Errorf("a document without kind: err = %v", err)
	}
}

func TestYAMLFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.yaml", "a.json", "c.yml", "notes.md"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755); err != nil {
		t.Fatal(err)
	}
	got, err := YAMLFiles(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.json"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.yml")}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("YAMLFiles (-want +got):\n%s", d)
	}
	if got, err := YAMLFiles(filepath.Join(dir, "missing"), true); err != nil || got != nil {
		t.Errorf("optional missing dir: %v %v", got, err)
	}
	if _, err := YAMLFiles(filepath.Join(dir, "missing"), false); err == nil {
		t.Error("required missing dir: no error")
	}
}

func TestAnnotationKeysOrder(t *testing.T) {
	a := BundleAnnotations{Annotations: map[string]string{
		"z.custom": "1", AnnotationChannels: "stable", AnnotationMediaType: MediaTypeRegistryV1, "a.custom": "2", AnnotationPackage: "p",
	}}
	want := []string{AnnotationMediaType, AnnotationPackage, AnnotationChannels, "a.custom", "z.custom"}
	if d := cmp.Diff(want, a.SortedKeys()); d != "" {
		t.Errorf("SortedKeys (-want +got):\n%s", d)
	}
}
