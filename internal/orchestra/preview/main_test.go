package preview

import (
	"os"
	"testing"
)

// TestMain clears the proxy variables before any test runs: the proxy-env
// post-renderer copies them into the rendered pods, and the golden files
// pin what a cluster without a proxy gets.
func TestMain(m *testing.M) {
	for _, v := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		_ = os.Unsetenv(v)
	}
	os.Exit(m.Run())
}
