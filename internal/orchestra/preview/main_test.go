package preview

import (
	"os"
	"testing"
)

// TestMain clears the proxy variables before any test runs: the proxy-env
// post-renderer copies them into the rendered pods, and the golden files
// pin what a cluster without a proxy gets. It removes the binaries the
// tests built, once all have run.
func TestMain(m *testing.M) {
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		_ = os.Unsetenv(v)
	}
	code := m.Run()
	if binariesDir != "" {
		_ = os.RemoveAll(binariesDir)
	}
	os.Exit(code)
}
