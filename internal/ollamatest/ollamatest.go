// Package ollamatest runs the real Ollama engine for tests: the pinned
// static build (hack/tools/ollama, `hack/tools/install.sh ollama` puts it
// in bin/ollama) as an `ollama serve` process on a free port, with its own
// temporary HOME and OLLAMA_MODELS, and pushes models to it the way the
// chart does without the CLI: POST /api/blobs/sha256:<digest>, then
// POST /api/create.
//
// Tests that need it call Start, which skips them, with the reason, under
// `go test -short` (make test-unit) and when the binary is absent.
package ollamatest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EnvBinary names an ollama binary to use instead of bin/ollama.
const EnvBinary = "MO_OLLAMA"

// Version is the Ollama release the project pins (hack/tools/ollama/go.mod).
const Version = "0.17.4"

// Binary finds the ollama binary: $MO_OLLAMA, else $MO_BIN_DIR/ollama
// (the Makefile exports MO_BIN_DIR), else bin/ollama in the module root.
func Binary() (string, error) {
	if p := os.Getenv(EnvBinary); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s=%s: %w", EnvBinary, p, err)
		}
		return p, nil
	}
	var candidates []string
	if d := os.Getenv("MO_BIN_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "ollama"))
	}
	if root, err := moduleRoot(); err == nil {
		candidates = append(candidates, filepath.Join(root, "bin", "ollama"))
	}
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", fmt.Errorf("no ollama binary (looked at %s): `hack/tools/install.sh ollama` builds the pinned Ollama %s into bin/ (once per pin, about 6 minutes on 2 cores), or set %s", strings.Join(candidates, ", "), Version, EnvBinary)
}

// moduleRoot is the directory of the go.mod above the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			// hack/tools/<tool>/go.mod modules are not the root.
			if _, err := os.Stat(filepath.Join(dir, "hack", "tools", "install.sh")); err == nil {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no module root")
		}
		dir = parent
	}
}

// Server is a running `ollama serve`.
type Server struct {
	// URL is the base URL, http://127.0.0.1:<port>.
	URL string
	// Dir holds its HOME, models and log.
	Dir string

	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// Start runs `ollama serve` for the test and stops it (and its runners) in
// t.Cleanup. It skips the test under -short and when there is no binary.
func Start(t testing.TB) *Server {
	t.Helper()
	if testing.Short() {
		t.Skip("runs the real Ollama engine: skipped under -short (make test-unit)")
	}
	bin, err := Binary()
	if err != nil {
		t.Skipf("real Ollama engine not available: %v", err)
	}
	s, err := start(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("ollama serve log (%s), last lines:\n%s", s.log, tail(s.log, 40))
		}
	})
	return s
}

func start(bin, dir string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close() // ollama binds it next; a race with another listener fails the start below
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		return nil, err
	}
	s := &Server{URL: "http://" + addr, Dir: dir, done: make(chan struct{}), log: filepath.Join(dir, "ollama.log")}
	logf, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = logf.Close() }() // the child has its own descriptor
	s.cmd = exec.Command(bin, "serve")
	s.cmd.Env = append(os.Environ(),
		"HOME="+home,
		"OLLAMA_HOST="+addr,
		"OLLAMA_MODELS="+filepath.Join(dir, "models"),
		"GIN_MODE=release",
		"OLLAMA_NOPRUNE=1",
	)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its runners stop with it
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s serve: %w", bin, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		resp, err := http.Get(s.URL + "/api/version")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("ollama serve exited at start: %s", tail(s.log, 20))
		case <-ctx.Done():
			s.Stop()
			return nil, fmt.Errorf("ollama serve did not answer on %s within 30s: %s", s.URL, tail(s.log, 20))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop ends the server: SIGTERM to its process group (ollama serve and the
// runners it started), SIGKILL after 10 s.
func (s *Server) Stop() {
	pgid := s.cmd.Process.Pid
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
		<-s.done
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // runners that outlived serve
}

// Create pushes a GGUF model and creates name from it, as the chart does:
// the blob by its sha256, then /api/create with the file. Ollama names the
// model name:latest when name has no tag.
//
// The model gets num_thread 1: ggml's CPU threads spin at every barrier,
// and on a busy machine (a shared CI runner, parallel test packages) a
// descheduled second thread makes generation hundreds of times slower
// (measured here under load 25 on 2 cores: 4 tokens/s with 2 threads, 1,410
// with 1).
func (s *Server) Create(ctx context.Context, name string, gguf []byte) error {
	sum := sha256.Sum256(gguf)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/api/blobs/"+digest, bytes.NewReader(gguf))
	if err != nil {
		return err
	}
	if err := do(req, http.StatusCreated, nil); err != nil {
		return fmt.Errorf("pushing the blob of %s: %w", name, err)
	}
	body, _ := json.Marshal(map[string]any{
		"model": name, "files": map[string]string{"model.gguf": digest}, "stream": false,
		"parameters": map[string]any{"num_thread": 1},
	})
	req, err = http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/api/create", bytes.NewReader(body))
	if err != nil {
		return err
	}
	var out struct {
		Status string `json:"status"`
	}
	if err := do(req, http.StatusOK, &out); err != nil {
		return fmt.Errorf("creating %s: %w", name, err)
	}
	if out.Status != "success" {
		return fmt.Errorf("creating %s: status %q", name, out.Status)
	}
	return nil
}

// do sends req and wants the status; it decodes a JSON answer into out.
func do(req *http.Request, want int, out any) error {
	if req.Body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// tail is the last n lines of a file.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
