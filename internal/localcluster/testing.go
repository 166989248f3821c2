package localcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
)

// Environment variables read by StartForTest.
const (
	// EnvLogDir makes StartForTest keep component logs in
	// $MO_LOCALCLUSTER_LOG_DIR/<test name>-<random>, for CI artifacts.
	EnvLogDir = "MO_LOCALCLUSTER_LOG_DIR"
	// EnvLockWait is how long a real-node StartForTest waits for another
	// real-node cluster on the machine (a Go duration). Default 25m.
	EnvLockWait = "MO_LOCALCLUSTER_LOCK_WAIT"
)

// The e2e package holds its cluster for about 15 minutes of `make test`,
// and the other real-node packages run beside it: they wait for it, and
// still end within make test's 40-minute package timeout.
const defaultTestLockWait = 25 * time.Minute

// ShortSkip is why a test that needs a cluster skips under -short.
const ShortSkip = "needs a local cluster: skipped under -short (make test-unit); make test runs it"

// SkipUnderShort skips t under -short, the mode of `make test-unit`, which
// runs only the tests that need no cluster. StartForTest calls it; a test
// package that starts its cluster another way calls it first.
func SkipUnderShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip(ShortSkip)
	}
}

// StartForTest starts a cluster for t and stops it in t.Cleanup. When the
// test has failed, the tail of every component log is printed first.
// Real-node clusters wait for the machine-wide lock (see EnvLockWait)
// instead of failing when another test package holds it. Under -short it
// skips t instead (see SkipUnderShort).
func StartForTest(t testing.TB, opts Options) *Cluster {
	t.Helper()
	SkipUnderShort(t)
	if opts.LogDir == "" {
		if dir := os.Getenv(EnvLogDir); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatalf("localcluster: %s: %v", EnvLogDir, err)
			}
			logDir, err := os.MkdirTemp(dir, safeName(t.Name())+"-")
			if err != nil {
				t.Fatalf("localcluster: %v", err)
			}
			opts.LogDir = logDir
		}
	}
	if opts.RealNode && opts.LockWait == 0 {
		opts.LockWait = defaultTestLockWait
		if v := os.Getenv(EnvLockWait); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil {
				t.Fatalf("localcluster: %s=%q: %v", EnvLockWait, v, err)
			}
			opts.LockWait = d
		}
	}
	started := time.Now()
	c, err := Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("starting local cluster: %v", err)
	}
	t.Logf("local cluster up in %s (kubeconfig %s, logs in %s)", time.Since(started).Round(10*time.Millisecond), c.KubeconfigFile(), c.LogDir())
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(c.LogTails(40))
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stopping local cluster: %v", err)
		}
	})
	return c
}

// LogTails returns the last lines of every component log, for a test
// failure report.
func (c *Cluster) LogTails(lines int) string {
	logs, _ := filepath.Glob(filepath.Join(c.logDir, "*.log"))
	sort.Strings(logs)
	var b strings.Builder
	for _, l := range logs {
		fmt.Fprintf(&b, "\n===== last %d lines of %s =====\n%s\n", lines, l, tailFile(l, lines))
	}
	return b.String()
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

func safeName(s string) string { return unsafeChars.ReplaceAllString(s, "_") }
