package manager_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
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
	code := m.Run()
	if testCluster != nil {
		if err := testCluster.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the local control plane: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	clusterOnce sync.Once
	testCluster *localcluster.Cluster
	clusterErr  error
)

// needCluster starts the package's one control plane (with
// kube-controller-manager) on first use.
func needCluster(t *testing.T) *rest.Config {
	t.Helper()
	clusterOnce.Do(func() {
		testCluster, clusterErr = localcluster.Start(context.Background(), localcluster.Options{ControllerManager: true})
	})
	if clusterErr != nil {
		t.Fatalf("local control plane: %v", clusterErr)
	}
	return testCluster.Config()
}
