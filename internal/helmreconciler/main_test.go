package helmreconciler_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/localcluster"
)

// One control plane (etcd, kube-apiserver, kube-controller-manager for
// garbage collection) serves every test of the package; each test works in
// its own namespace with its own manager.
var (
	restCfg    *rest.Config
	kubeconfig string
	k8s        client.Client
	moduleRoot string
)

// TestMain stops the control plane, if a test started one. ENGINE_TEST_LOG
// set to anything sends the engine's logs to stderr.
func TestMain(m *testing.M) {
	logOut := io.Discard
	if os.Getenv("ENGINE_TEST_LOG") != "" {
		logOut = os.Stderr
	}
	ctrl.SetLogger(zap.New(zap.WriteTo(logOut), zap.UseDevMode(true)))
	os.Exit(cluster.Run(m))
}

var (
	cluster     = localcluster.Shared{Options: localcluster.Options{ControllerManager: true}, Setup: setupCluster}
	testCluster *localcluster.Cluster
)

// needCluster starts the package's control plane on first use (so that the
// pure unit tests of the package run without one) and fails the test if it
// cannot start.
func needCluster(t *testing.T) {
	t.Helper()
	cluster.Get(t)
}

// setupCluster fills the package's variables from the started cluster and
// installs the test CRDs.
func setupCluster(c *localcluster.Cluster) error {
	root, err := localcluster.ModuleRoot()
	if err != nil {
		return err
	}
	moduleRoot = root
	testCluster = c
	restCfg = c.Config()
	restCfg.QPS, restCfg.Burst = 200, 400
	kubeconfig = c.KubeconfigFile()

	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	k8s, err = client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	return installCRDs(context.Background())
}

// installCRDs creates the CRDs of testdata/crds and waits until the API
// server serves each.
func installCRDs(ctx context.Context) error {
	files, _ := filepath.Glob("testdata/crds/*.yaml")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, crd); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := k8s.Create(ctx, crd); err != nil {
			return fmt.Errorf("creating CRD %s: %w", crd.Name, err)
		}
		// Until it is established, or while the new CRD is not yet found,
		// ask again.
		err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			got := &apiextensionsv1.CustomResourceDefinition{}
			err := k8s.Get(ctx, client.ObjectKeyFromObject(crd), got)
			return err == nil && established(got), nil
		})
		if err != nil {
			return fmt.Errorf("CRD %s not established: %w", crd.Name, err)
		}
	}
	return nil
}

func established(crd *apiextensionsv1.CustomResourceDefinition) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
			return true
		}
	}
	return false
}
