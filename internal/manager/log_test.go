package manager_test

import (
	"io"
	"os"

	"github.com/go-logr/logr"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func ctrlLogger() logr.Logger {
	out := io.Discard
	if os.Getenv("ENGINE_TEST_LOG") != "" {
		out = os.Stderr
	}
	return zap.New(zap.WriteTo(out), zap.UseDevMode(true))
}
