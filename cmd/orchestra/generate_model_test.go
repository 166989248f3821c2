package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGenerateModelPrintsItsSHA256(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	out, err := run(t, "", "generate-model", "-o", path)
	if err != nil {
		t.Fatalf("generate-model: %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if want := hex.EncodeToString(sum[:]) + "  " + path + "\n"; !strings.HasPrefix(out, want) {
		t.Errorf("output %q, want it to start with %q", out, want)
	}
	if !strings.Contains(out, "2 layers, embedding 64, 4 heads, feed-forward 128, context 256") {
		t.Errorf("output %q does not describe the tiny model", out)
	}
}

func TestGenerateModelRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"generate-model"}, "--output (-o) is required"},
		{[]string{"generate-model", "-o", "x.gguf", "--size", "huge"}, `size "huge": want a positive number`},
		{[]string{"generate-model", "-o", "x.gguf", "--size", "10KiB"}, "the smallest model (tiny) takes"},
		{[]string{"generate-model", "-o", "x.gguf", "--context", "4"}, "context 4: want at least 16"},
	} {
		if out, err := run(t, "", tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v (%s), want an error containing %q", tc.args, err, out, tc.want)
		}
	}
}
