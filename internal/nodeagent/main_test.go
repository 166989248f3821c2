package nodeagent_test

import (
	"os"
	"testing"

	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
)

// The process snapshot tests dump a real simulator process, the test
// binary run as one (enginetest.RunFakeEngine).
func TestMain(m *testing.M) {
	enginetest.MainIfFakeEngine()
	os.Exit(m.Run())
}
