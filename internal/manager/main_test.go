package manager_test

import (
	"io"
	"os"
	"testing"

	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/model-orchestra/operator/internal/localcluster"
)

// TestMain stops the control plane, if a test started one. ENGINE_TEST_LOG
// set to anything sends the manager's logs to stderr.
func TestMain(m *testing.M) {
	out := io.Discard
	if os.Getenv("ENGINE_TEST_LOG") != "" {
		out = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(out), zap.UseDevMode(true)))
	os.Exit(cluster.Run(m))
}

// cluster is the package's one control plane (with
// kube-controller-manager), started on first use.
var cluster = localcluster.Shared{Options: localcluster.Options{ControllerManager: true}}

// needCluster starts the package's one control plane on first use.
func needCluster(t *testing.T) *rest.Config {
	t.Helper()
	return cluster.Get(t).Config()
}
