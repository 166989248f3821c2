package dataplanetest

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteSectionTouchesOnlyItsSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	if err := WriteSection(path, "first\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	withOthers := "# Benchmarks\n\n## Other\nkeep me\n" + string(b)[len("# Benchmarks\n"):] + "\n## After\nkeep me too\n"
	if err := os.WriteFile(path, []byte(withOthers), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteSection(path, "second\n"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	want := "# Benchmarks\n\n## Other\nkeep me\n\n## Data plane\n\n" + MarkerStart + "\nsecond\n" + MarkerEnd + "\n\n## After\nkeep me too\n"
	if string(got) != want {
		t.Errorf("file:\n%s\nwant:\n%s", got, want)
	}
}
