package sidebyside

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// repoRoot is the module root, relative to this package.
const repoRoot = "../../.."

// operatorVersion is one operator installed as OLM would in OwnNamespace
// mode.
type operatorVersion struct {
	version   string // the CSV's spec.version
	bundleDir string // whose CSV Deployment environment and permissions are used
	namespace string // installed in, and watched
}

// TestTwoVersionsSideBySide installs operator 0.2.0 in team-a and 1.0.0 in
// team-b as OLM would in OwnNamespace mode: each process gets its own
// CSV's Deployment environment (the RELATED_IMAGE_* variables of that
// release) plus WATCH_NAMESPACE, runs as a ServiceAccount holding its CSV's
// permissions in its namespace only, and both share the CRD of the current
// bundle. A ModelOrchestra in team-a must be deployed by 0.2.0 (its images
// carry v0.2.0), one in team-b by 1.0.0, and one in team-c by neither.
//
// Both processes run the operator built from this tree: the releases differ
// here by their bundles (environment, permissions), not by their code.
func TestTwoVersionsSideBySide(t *testing.T) {
	localcluster.SkipUnderShort(t) // before building the operator
	versions := []operatorVersion{
		{version: "0.2.0", bundleDir: "catalog/bundles/0.2.0", namespace: "team-a"},
		{version: "1.0.0", bundleDir: "bundle", namespace: "team-b"},
	}
	const unwatched = "team-c"

	bin := filepath.Join(t.TempDir(), "orchestra-operator")
	buildOperator(t, bin)

	c := localcluster.StartForTest(t, localcluster.Options{ControllerManager: true})
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(c.Config(), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// The shared CRD, from the newest bundle, as OLM would apply it.
	current, err := bundle.Load(filepath.Join(repoRoot, "bundle"))
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range current.CRDs {
		obj := crd.DeepCopy()
		obj.ResourceVersion = ""
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("creating CRD %s: %v", crd.Name, err)
		}
		eventually(t, 30*time.Second, func() error {
			var got apiextv1.CustomResourceDefinition
			if err := admin.Get(ctx, client.ObjectKey{Name: crd.Name}, &got); err != nil {
				return fmt.Errorf("reading CRD %s: %w", crd.Name, err)
			}
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextv1.Established && cond.Status == apiextv1.ConditionTrue {
					return nil
				}
			}
			return fmt.Errorf("CRD %s is not established yet: conditions %v", crd.Name, got.Status.Conditions)
		})
	}

	for _, ns := range []string{"team-a", "team-b", unwatched} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}

	for _, v := range versions {
		b, err := bundle.Load(filepath.Join(repoRoot, v.bundleDir))
		if err != nil {
			t.Fatal(err)
		}
		if b.CSV.Spec.Version.String() != v.version {
			t.Fatalf("%s holds version %s, want %s", v.bundleDir, b.CSV.Spec.Version, v.version)
		}
		if !bundle.Supports(b.CSV, v1alpha1.InstallModeTypeOwnNamespace) {
			t.Fatalf("%s does not support OwnNamespace", b.CSV.Name)
		}
		sa := grantOwnNamespace(ctx, t, admin, b, v.namespace)
		startOperator(t, c, bin, b, v.namespace, sa)
	}

	sample := loadSample(t)
	for _, ns := range []string{"team-a", "team-b", unwatched} {
		obj := sample.DeepCopy()
		obj.SetNamespace(ns)
		if err := admin.Create(ctx, obj); err != nil {
			t.Fatalf("creating %s in %s: %v", obj.GetName(), ns, err)
		}
	}

	for _, v := range versions {
		want := "ghcr.io/model-orchestra/orchestra-gateway:v" + v.version
		eventually(t, 3*time.Minute, func() error {
			images, err := deploymentImages(ctx, admin, v.namespace)
			if err != nil {
				return fmt.Errorf("listing the Deployments in %s: %w", v.namespace, err)
			}
			for _, img := range images {
				if img == want {
					return nil
				}
				if strings.HasPrefix(img, "ghcr.io/model-orchestra/orchestra-gateway:") {
					// Waiting longer cannot fix this.
					t.Fatalf("namespace %s runs gateway %s, want %s: the wrong operator version reconciled it", v.namespace, img, want)
				}
			}
			return fmt.Errorf("operator %s has not deployed the gateway %s in %s yet (images %v)", v.version, want, v.namespace, images)
		})
		eventually(t, time.Minute, func() error {
			var mo unstructured.Unstructured
			mo.SetGroupVersionKind(sample.GroupVersionKind())
			if err := admin.Get(ctx, client.ObjectKey{Namespace: v.namespace, Name: sample.GetName()}, &mo); err != nil {
				return fmt.Errorf("reading %s in %s: %w", sample.GetName(), v.namespace, err)
			}
			if name, _, _ := unstructured.NestedString(mo.Object, "status", "deployedRelease", "name"); name == "" {
				return fmt.Errorf("%s in %s has no status.deployedRelease yet", sample.GetName(), v.namespace)
			}
			return nil
		})
	}

	// Both operators are up and have reconciled their namespace; neither
	// may touch the third one.
	consistently(t, 5*time.Second, func() error {
		images, err := deploymentImages(ctx, admin, unwatched)
		if err != nil {
			return err
		}
		if len(images) > 0 {
			return fmt.Errorf("deployments appeared in %s: %v", unwatched, images)
		}
		var mo unstructured.Unstructured
		mo.SetGroupVersionKind(sample.GroupVersionKind())
		if err := admin.Get(ctx, client.ObjectKey{Namespace: unwatched, Name: sample.GetName()}, &mo); err != nil {
			return fmt.Errorf("reading %s in %s: %w", sample.GetName(), unwatched, err)
		}
		if len(mo.GetFinalizers()) > 0 || mo.Object["status"] != nil {
			return fmt.Errorf("the %s resource was reconciled: finalizers %v, status %v", unwatched, mo.GetFinalizers(), mo.Object["status"])
		}
		return nil
	})
}

// buildOperator builds cmd/orchestra-operator.
func buildOperator(t *testing.T, out string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, "./cmd/orchestra-operator")
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the operator: %v\n%s", err, b)
	}
}

// grantOwnNamespace does what OLM does for an OwnNamespace install: a
// ServiceAccount and the CSV's permissions as a Role bound to it, in the
// operator's namespace only. It returns the ServiceAccount name.
func grantOwnNamespace(ctx context.Context, t *testing.T, c client.Client, b *bundle.Bundle, ns string) string {
	t.Helper()
	perms := b.CSV.Spec.InstallStrategy.StrategySpec.Permissions
	if len(perms) != 1 {
		t.Fatalf("%s: want one permissions entry, got %d", b.CSV.Name, len(perms))
	}
	if len(b.CSV.Spec.InstallStrategy.StrategySpec.ClusterPermissions) > 0 {
		t.Fatalf("%s asks for clusterPermissions; OwnNamespace installs would grant them cluster-wide", b.CSV.Name)
	}
	sa := perms[0].ServiceAccountName
	objs := []client.Object{
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns}},
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: b.CSV.Name, Namespace: ns}, Rules: perms[0].Rules},
		&rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.CSV.Name, Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: b.CSV.Name},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}},
		},
	}
	for _, o := range objs {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("granting %s in %s: %v", b.CSV.Name, ns, err)
		}
	}
	return sa
}

// startOperator runs the operator as the CSV's Deployment would run in
// namespace ns: with the literal environment of its container, WATCH_NAMESPACE
// as olm.targetNamespaces would set it, as the ServiceAccount sa. It is
// stopped in t.Cleanup.
func startOperator(t *testing.T, c *localcluster.Cluster, bin string, b *bundle.Bundle, ns, sa string) {
	t.Helper()
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, c.ImpersonateServiceAccount(ns, sa)); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "operator.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin,
		"--leader-elect", "--leader-election-namespace="+ns,
		"--metrics-bind-address=0", "--health-probe-bind-address=0")
	env := []string{"KUBECONFIG=" + kubeconfig, "WATCH_NAMESPACE=" + ns, "POD_NAMESPACE=" + ns}
	for _, e := range b.CSV.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		// Wait reports the signal we sent: logged, not checked.
		select {
		case err := <-done:
			t.Logf("operator exited: %v", err)
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Logf("operator killed after 15s: %v", <-done)
		}
		_ = logFile.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logPath)
			if len(data) > 8000 {
				data = data[len(data)-8000:]
			}
			t.Logf("operator %s in %s, log tail:\n%s", b.CSV.Name, ns, data)
		}
	})
}

func writeKubeconfig(path string, cfg *rest.Config) error {
	cluster := &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, CertificateAuthority: cfg.CAFile}
	user := &clientcmdapi.AuthInfo{
		ClientCertificateData: cfg.CertData, ClientCertificate: cfg.CertFile,
		ClientKeyData: cfg.KeyData, ClientKey: cfg.KeyFile,
		Token:             cfg.BearerToken,
		Impersonate:       cfg.Impersonate.UserName,
		ImpersonateGroups: cfg.Impersonate.Groups,
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = cluster
	kc.AuthInfos["operator"] = user
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "operator"}
	kc.CurrentContext = "local"
	return clientcmd.WriteToFile(*kc, path)
}

// loadSample returns the simulator sample, the smallest stack.
func loadSample(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "config", "samples", "simulator.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := manifest.Objects(data)
	if err != nil || len(objs) != 1 {
		t.Fatalf("config/samples/simulator.yaml: %v (%d objects)", err, len(objs))
	}
	return objs[0]
}

func deploymentImages(ctx context.Context, c client.Client, ns string) ([]string, error) {
	var list unstructured.UnstructuredList
	list.SetAPIVersion("apps/v1")
	list.SetKind("DeploymentList")
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var out []string
	for _, d := range list.Items {
		containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
		for _, ct := range containers {
			var c corev1.Container
			if m, ok := ct.(map[string]any); ok {
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &c); err == nil {
					out = append(out, c.Image)
				}
			}
		}
	}
	return out, nil
}
