package gctune

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSoftLimit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	v2 := write("memory.max", "536870912\n")
	unlimited := write("unlimited", "max\n")
	v1huge := write("v1", "9223372036854771712\n")
	missing := filepath.Join(dir, "missing")

	tests := []struct {
		name  string
		files []string
		want  int64
		ok    bool
	}{
		{"512Mi limit gives 80%", []string{v2}, 536870912 / 10 * 8, true},
		{"the first readable file counts", []string{missing, v2}, 536870912 / 10 * 8, true},
		{"max is no limit", []string{unlimited, v2}, 0, false},
		{"cgroup v1 without a limit", []string{v1huge}, 0, false},
		{"no cgroup files", []string{missing}, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := softLimit(tc.files)
			if got != tc.want || ok != tc.ok {
				t.Errorf("softLimit = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
