package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/model-orchestra/operator/internal/e2e/stack"
)

// userRepo is the mirror repository of a GGUF file of the user's
// (make run MODEL=...).
const userRepo = "local/user-model"

// userModel is the model the Ollama application serves: the generated
// tiny model (repo empty), or a GGUF file of the user's in userRepo.
type userModel struct {
	repo string // hf repository in the mirror; empty: the generated model
	file string // its GGUF file
	path string // where it is on this machine
	size int64
}

// mirrorUserModel checks c.model, when set: the mirror serves it in
// place (hubmirror --file) as the only file of userRepo, and the operator
// fetches and verifies it like any model.
func mirrorUserModel(c config) (userModel, error) {
	if c.model == "" {
		return userModel{}, nil
	}
	path := c.model
	if strings.HasPrefix(path, "~/") {
		home, err := os.UserHomeDir()
		if err != nil {
			return userModel{}, err
		}
		path = filepath.Join(home, path[2:])
	}
	path, err := filepath.Abs(path)
	if err != nil {
		return userModel{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return userModel{}, fmt.Errorf("MODEL: %w", err)
	}
	if !st.Mode().IsRegular() {
		return userModel{}, fmt.Errorf("MODEL %s is not a regular file", path)
	}
	if err := checkGGUF(path); err != nil {
		return userModel{}, err
	}
	return userModel{repo: userRepo, file: filepath.Base(path), path: path, size: st.Size()}, nil
}

// checkGGUF refuses a file that does not start with the GGUF magic, here
// rather than after the download, where Ollama would refuse it.
func checkGGUF(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || string(magic) != "GGUF" {
		return fmt.Errorf("MODEL %s is not a GGUF file (it does not start with \"GGUF\"): Ollama serves GGUF models", path)
	}
	return nil
}

var nonName = regexp.MustCompile(`[^a-z0-9]+`)

// served is the name the Ollama application serves.
func (m userModel) served() string {
	if m.repo == "" {
		return "tiny-ollama"
	}
	n := strings.Trim(nonName.ReplaceAllString(strings.ToLower(strings.TrimSuffix(m.file, filepath.Ext(m.file))), "-"), "-")
	if len(n) > 40 {
		n = strings.TrimRight(n[:40], "-")
	}
	if n == "" {
		n = "user-model"
	}
	return n
}

// cacheSize fits the file with room to spare: at least 1Gi.
func (m userModel) cacheSize() string {
	gi := (m.size*5/4)>>30 + 1
	return fmt.Sprintf("%dGi", gi)
}

func (m userModel) describe() string {
	if m.repo == "" {
		return "the generated model " + stack.DemoFile + " (tiny, random weights: its text is gibberish)"
	}
	return "your model " + m.file
}

// also names the user's repository for the mirror's and fetch's messages.
func (m userModel) also() string {
	if m.repo == "" {
		return ""
	}
	return fmt.Sprintf(" and hf://%s (%s, %s)", m.repo, m.file, humanSize(m.size))
}

func humanSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d B", n)
}
