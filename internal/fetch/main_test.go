package fetch

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"
)

const childEnv = "ORCHESTRA_FETCH_TEST_CHILD_CONFIG"

// TestMain lets a test run the fetcher in a child process (this test
// binary) so that it can be killed with SIGKILL mid-download.
func TestMain(m *testing.M) {
	if raw := os.Getenv(childEnv); raw != "" {
		var cfg Config
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			fmt.Fprintln(os.Stderr, "child config:", err)
			os.Exit(99)
		}
		_, err := Run(context.Background(), cfg, Options{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
		}
		os.Exit(ExitCode(err))
	}
	os.Exit(m.Run())
}
