package realolm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	operatorsv1 "github.com/operator-framework/api/pkg/operators/v1"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	operatorsv2 "github.com/operator-framework/api/pkg/operators/v2"
	"github.com/operator-framework/operator-registry/alpha/declcfg"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/olm/bundle"
	"github.com/model-orchestra/operator/internal/olm/catalog"
)

const (
	examples     = repoRoot + "/docs/examples/olm"
	operatorRepo = "ghcr.io/model-orchestra/orchestra-operator"
	csvV1        = "orchestra-operator.v1.0.0"
	csvV0        = "orchestra-operator.v0.2.1"
	// The operator image of the v0 line: its CRD carrier 0.2.1 changes
	// only the CRDs and runs 0.2.0's operator.
	imageV0 = operatorRepo + ":v0.2.0"
	imageV1 = operatorRepo + ":v1.0.0"
)

// TestVersionsSideBySideUnderRealOLM installs the operator with OLM v0 as
// docs/install.md tells users to, from the image-less catalog served by opm:
//
//  1. 1.0.0 in team-a (stable-v1) and 0.2.1 in team-b (stable-v0), each in
//     its own OwnNamespace OperatorGroup, each through a Manual InstallPlan
//     that installs nothing until approved;
//  2. each Deployment runs its own version's image and watches its own
//     namespace (WATCH_NAMESPACE from olm.targetNamespaces);
//  3. a ModelOrchestra using fields that 0.2.0's CRD lacked survives, with
//     writes in between, every install in both orders: 0.2.1 after 1.0.0
//     (team-b), and 1.0.0 after 0.2.1 (team-b's upgrade);
//  4. team-b upgrades to 1.0.0 by switching its Subscription to stable-v1,
//     and OLM holds that upgrade while the operator reports
//     Upgradeable=False (a Helm action in flight), then completes it;
//  5. and, as a control, that the same checks see the loss the CRD
//     carriers prevent: 0.2.0 from a catalog of its own, installed in
//     team-c, replaces the shared CRD with its own, and team-a's resource
//     reads back without its lifecycle fields.
func TestVersionsSideBySideUnderRealOLM(t *testing.T) {
	e, c, address := startOLM(t, repoRoot+"/catalog/inline")
	cl := newClient(t, c.Config())

	// The CatalogSource of the docs, served by the opm above instead of a
	// catalog image: the same object with spec.address for spec.image.
	cs := readObject(t, filepath.Join(examples, "catalogsource.yaml"))
	if err := unstructured.SetNestedField(cs.Object, address, "spec", "address"); err != nil {
		t.Fatal(err)
	}
	unstructured.RemoveNestedField(cs.Object, "spec", "image")
	unstructured.RemoveNestedField(cs.Object, "spec", "updateStrategy")
	applyObject(t, e, cs)
	eventually(t, 60*time.Second, func() error {
		var got v1alpha1.CatalogSource
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "olm", Name: "model-orchestra"}, &got); err != nil {
			return err
		}
		if s := got.Status.GRPCConnectionState; s == nil || s.LastObservedState != "READY" {
			return fmt.Errorf("CatalogSource not READY: %+v", got.Status.GRPCConnectionState)
		}
		return nil
	})

	// 1.0.0 in team-a, approved by hand.
	e.kubectl("apply", "-f", filepath.Join(examples, "team-a.yaml"))
	approveFirstInstall(t, e, cl, "team-a", csvV1)
	waitCSV(t, cl, "team-a", csvV1, v1alpha1.CSVPhaseSucceeded, "")
	checkDeployment(t, cl, "team-a", imageV1, csvV1)

	// A resource using 1.0.0's fields (the lifecycle sample: scale to zero).
	a := createSample(t, cl, "team-a")

	// 0.2.1 in team-b: OLM applies its CRD over 1.0.0's.
	e.kubectl("apply", "-f", filepath.Join(examples, "team-b.yaml"))
	approveFirstInstall(t, e, cl, "team-b", csvV0)
	waitCSV(t, cl, "team-b", csvV0, v1alpha1.CSVPhaseSucceeded, "")
	checkDeployment(t, cl, "team-b", imageV0, csvV0)
	checkDeployment(t, cl, "team-a", imageV1, csvV1)
	// Both operators' groups provide the same API without conflict.
	for _, ns := range []string{"team-a", "team-b"} {
		var og operatorsv1.OperatorGroup
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orchestra"}, &og); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(og.Status.Namespaces, []string{ns}) {
			t.Errorf("OperatorGroup %s/orchestra targets %v, want [%s]", ns, og.Status.Namespaces, ns)
		}
	}
	writeAndCheck(t, cl, a, "after-0.2.1")
	b := createSample(t, cl, "team-b")

	// The upgrade of team-b by channel switch, held by Upgradeable=False.
	setUpgradeable(t, cl, "team-b", csvV0, metav1.ConditionFalse, manager.ReasonActionInFlight, "install of team-b/demo is running")
	e.kubectl("-n", "team-b", "patch", "subscription", "orchestra-operator", "--type", "merge", "-p", `{"spec":{"channel":"stable-v1"}}`)
	waitInstallPlan(t, cl, "team-b", csvV1)
	e.sh(filepath.Join(examples, "approve.sh"), "team-b")
	waitCSV(t, cl, "team-b", csvV1, v1alpha1.CSVPhasePending, v1alpha1.CSVReasonOperatorConditionNotUpgradeable)
	consistently(t, 5*time.Second, func() error {
		var old v1alpha1.ClusterServiceVersion
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "team-b", Name: csvV0}, &old); err != nil {
			return fmt.Errorf("the running 0.2.1 CSV: %w", err)
		}
		// OLM marks it Replacing at once, and leaves it running.
		if p := old.Status.Phase; p != v1alpha1.CSVPhaseSucceeded && p != v1alpha1.CSVPhaseReplacing {
			return fmt.Errorf("0.2.1 is %s while 1.0.0 may not replace it: %s", p, old.Status.Message)
		}
		var neu v1alpha1.ClusterServiceVersion
		if err := cl.Get(ctx, client.ObjectKey{Namespace: "team-b", Name: csvV1}, &neu); err != nil {
			return err
		}
		if neu.Status.Phase != v1alpha1.CSVPhasePending || neu.Status.Reason != v1alpha1.CSVReasonOperatorConditionNotUpgradeable {
			return fmt.Errorf("1.0.0 went on while 0.2.1 is not upgradeable: %s %s %s", neu.Status.Phase, neu.Status.Reason, neu.Status.Message)
		}
		return nil
	})
	checkDeployment(t, cl, "team-b", imageV0, csvV0)
	setUpgradeable(t, cl, "team-b", csvV0, metav1.ConditionTrue, manager.ReasonNoReleasePending, "")
	waitCSV(t, cl, "team-b", csvV1, v1alpha1.CSVPhaseSucceeded, "")
	eventually(t, 60*time.Second, func() error {
		var old v1alpha1.ClusterServiceVersion
		err := cl.Get(ctx, client.ObjectKey{Namespace: "team-b", Name: csvV0}, &old)
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("reading the replaced CSV %s: %w", csvV0, err)
		}
		return fmt.Errorf("the replaced CSV %s is still there: %s", csvV0, old.Status.Phase)
	})
	checkDeployment(t, cl, "team-b", imageV1, csvV1)

	// 1.0.0's CRD was applied again after 0.2.1's: nothing was lost on
	// either side.
	writeAndCheck(t, cl, a, "after-upgrade")
	writeAndCheck(t, cl, b, "after-upgrade")

	// What the carrier prevents, and that the checks above would see it:
	// 0.2.0, whose CRD lacks the lifecycle fields, installed from a catalog
	// of its own (as the committed catalog offered it before) replaces the
	// shared CRD, and team-a's resource reads back without them.
	legacy := legacyCatalog(t, repoRoot+"/catalog/bundles/0.2.0")
	legacyAddr := e.serveCatalog("opm-legacy", legacy)
	lcs := cs.DeepCopy()
	lcs.SetName("legacy")
	if err := unstructured.SetNestedField(lcs.Object, legacyAddr, "spec", "address"); err != nil {
		t.Fatal(err)
	}
	applyObject(t, e, lcs)
	e.kubectl("create", "namespace", "team-c")
	for _, obj := range []client.Object{
		&operatorsv1.OperatorGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "team-c", Name: "orchestra"}, Spec: operatorsv1.OperatorGroupSpec{TargetNamespaces: []string{"team-c"}}},
		&v1alpha1.Subscription{ObjectMeta: metav1.ObjectMeta{Namespace: "team-c", Name: "orchestra-operator"}, Spec: &v1alpha1.SubscriptionSpec{
			Package: "orchestra-operator", CatalogSource: "legacy", CatalogSourceNamespace: "olm", Channel: "legacy",
			StartingCSV: "orchestra-operator.v0.2.0", InstallPlanApproval: v1alpha1.ApprovalAutomatic}},
	} {
		if err := cl.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
	}
	waitCSV(t, cl, "team-c", "orchestra-operator.v0.2.0", v1alpha1.CSVPhaseSucceeded, "")
	eventually(t, 30*time.Second, func() error {
		got := &unstructured.Unstructured{}
		got.SetGroupVersionKind(a.GroupVersionKind())
		if err := cl.Get(ctx, client.ObjectKeyFromObject(a), got); err != nil {
			return err
		}
		if _, ok, _ := unstructured.NestedMap(got.Object, "spec", "applications", "echo", "lifecycle"); ok {
			return fmt.Errorf("team-a/%s still reads back with spec.applications.echo.lifecycle", a.GetName())
		}
		return nil
	})
}

// legacyCatalog writes an image-less FBC offering only the bundle in dir,
// in a channel "legacy", and returns its directory.
func legacyCatalog(t *testing.T, dir string) string {
	t.Helper()
	b, err := bundle.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := catalog.RenderBundleDir(dir, bundle.Default().BundleImage(b.CSV.Spec.Version.String()))
	if err != nil {
		t.Fatal(err)
	}
	r.Packages = []declcfg.Package{{Schema: declcfg.SchemaPackage, Name: b.Package(), DefaultChannel: "legacy"}}
	r.Channels = []declcfg.Channel{{Schema: declcfg.SchemaChannel, Package: b.Package(), Name: "legacy", Entries: []declcfg.ChannelEntry{{Name: b.CSV.Name}}}}
	inline, err := catalog.Inline(r)
	if err != nil {
		t.Fatal(err)
	}
	data, err := catalog.YAML(inline, "")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	if err := os.WriteFile(filepath.Join(out, "catalog.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := catalog.Validate(ctx, os.DirFS(out)); err != nil {
		t.Fatal(err)
	}
	return out
}

func newClient(t *testing.T, cfg *rest.Config) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, v1alpha1.AddToScheme, operatorsv1.AddToScheme, operatorsv2.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func readObject(t *testing.T, path string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &u.Object); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return u
}

// applyObject applies u with kubectl, as `kubectl apply -f` of its file.
func applyObject(t *testing.T, e *env, u *unstructured.Unstructured) {
	t.Helper()
	data, err := yaml.Marshal(u.Object)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "object.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	e.kubectl("apply", "-f", path)
}

// approveFirstInstall waits for the first InstallPlan of ns, checks that
// it waits for approval and that nothing is installed meanwhile, and
// approves it as docs/install.md shows.
func approveFirstInstall(t *testing.T, e *env, cl client.Client, ns, csv string) {
	t.Helper()
	waitInstallPlan(t, cl, ns, csv)
	var csvs v1alpha1.ClusterServiceVersionList
	if err := cl.List(ctx, &csvs, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, c := range csvs.Items {
		if c.Name == csv {
			t.Fatalf("%s/%s was installed before its InstallPlan was approved", ns, csv)
		}
	}
	e.sh(filepath.Join(examples, "approve.sh"), ns)
}

// waitInstallPlan waits for an InstallPlan of ns for csv that requires
// approval.
func waitInstallPlan(t *testing.T, cl client.Client, ns, csv string) {
	t.Helper()
	eventually(t, 90*time.Second, func() error {
		var ips v1alpha1.InstallPlanList
		if err := cl.List(ctx, &ips, client.InNamespace(ns)); err != nil {
			return err
		}
		var seen []string
		for _, ip := range ips.Items {
			seen = append(seen, fmt.Sprintf("%s %v approved=%t %s", ip.Name, ip.Spec.ClusterServiceVersionNames, ip.Spec.Approved, ip.Status.Phase))
			if slices.Contains(ip.Spec.ClusterServiceVersionNames, csv) && !ip.Spec.Approved && ip.Status.Phase == v1alpha1.InstallPlanPhaseRequiresApproval {
				return nil
			}
		}
		var sub v1alpha1.Subscription
		_ = cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: "orchestra-operator"}, &sub)
		return fmt.Errorf("no InstallPlan of %s for %s waits for approval; install plans %v; subscription state %q conditions %v", ns, csv, seen, sub.Status.State, sub.Status.Conditions)
	})
}

// waitCSV waits for csv in ns to reach phase (and reason, when given).
func waitCSV(t *testing.T, cl client.Client, ns, csv string, phase v1alpha1.ClusterServiceVersionPhase, reason v1alpha1.ConditionReason) {
	t.Helper()
	eventually(t, 2*time.Minute, func() error {
		var got v1alpha1.ClusterServiceVersion
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: csv}, &got); err != nil {
			return err
		}
		if got.Status.Phase != phase || (reason != "" && got.Status.Reason != reason) {
			return fmt.Errorf("CSV %s/%s is %s (%s: %s), want %s %s", ns, csv, got.Status.Phase, got.Status.Reason, got.Status.Message, phase, reason)
		}
		return nil
	})
}

// checkDeployment checks the operator Deployment OLM created in ns: the
// version's image, WATCH_NAMESPACE from the olm.targetNamespaces
// annotation, which OLM set to ns alone, and the OperatorCondition OLM
// names in OPERATOR_CONDITION_NAME.
func checkDeployment(t *testing.T, cl client.Client, ns, image, csv string) {
	t.Helper()
	eventually(t, 60*time.Second, func() error {
		var deps appsv1.DeploymentList
		if err := cl.List(ctx, &deps, client.InNamespace(ns)); err != nil {
			return err
		}
		if len(deps.Items) != 1 {
			return fmt.Errorf("%d Deployments in %s, want the operator's only", len(deps.Items), ns)
		}
		d := deps.Items[0]
		if got := d.Spec.Template.Annotations["olm.targetNamespaces"]; got != ns {
			return fmt.Errorf("Deployment %s/%s: pod annotation olm.targetNamespaces = %q, want %q", ns, d.Name, got, ns)
		}
		if len(d.Spec.Template.Spec.Containers) != 1 {
			return fmt.Errorf("Deployment %s/%s has %d containers", ns, d.Name, len(d.Spec.Template.Spec.Containers))
		}
		ctr := d.Spec.Template.Spec.Containers[0]
		if ctr.Image != image {
			return fmt.Errorf("Deployment %s/%s runs %s, want %s", ns, d.Name, ctr.Image, image)
		}
		var watch, cond string
		for _, v := range ctr.Env {
			switch v.Name {
			case "WATCH_NAMESPACE":
				if v.ValueFrom != nil && v.ValueFrom.FieldRef != nil {
					watch = v.ValueFrom.FieldRef.FieldPath
				}
			case manager.EnvOperatorConditionName:
				cond = v.Value
			}
		}
		if watch != "metadata.annotations['olm.targetNamespaces']" {
			return fmt.Errorf("Deployment %s/%s: WATCH_NAMESPACE from %q, want the olm.targetNamespaces annotation", ns, d.Name, watch)
		}
		if cond != csv {
			return fmt.Errorf("Deployment %s/%s: %s = %q, want %q", ns, d.Name, manager.EnvOperatorConditionName, cond, csv)
		}
		if d.Status.AvailableReplicas < 1 {
			return fmt.Errorf("Deployment %s/%s is not available", ns, d.Name)
		}
		return nil
	})
}

// createSample creates config/samples/simulator-lifecycle.yaml in ns and
// returns it as the API server stored it. Its lifecycle fields are in
// 1.0.0's CRD and were not in 0.2.0's.
func createSample(t *testing.T, cl client.Client, ns string) *unstructured.Unstructured {
	t.Helper()
	u := readObject(t, repoRoot+"/config/samples/simulator-lifecycle.yaml")
	u.SetNamespace(ns)
	if err := cl.Create(ctx, u); err != nil {
		t.Fatalf("creating %s/%s: %v", ns, u.GetName(), err)
	}
	if _, ok, _ := unstructured.NestedMap(u.Object, "spec", "applications", "echo", "lifecycle"); !ok {
		t.Fatalf("%s/%s was stored without spec.applications.echo.lifecycle", ns, u.GetName())
	}
	return u
}

// writeAndCheck writes to the stored resource (a label, as kubectl label
// does; any update, by a client or an operator, makes the API server store
// what the CRD's schema keeps) and checks that its spec is still the one
// created.
func writeAndCheck(t *testing.T, cl client.Client, created *unstructured.Unstructured, label string) {
	t.Helper()
	ns, name := created.GetNamespace(), created.GetName()
	patch := fmt.Sprintf(`{"metadata":{"labels":{"realolm-write":%q}}}`, label)
	w := &unstructured.Unstructured{}
	w.SetGroupVersionKind(created.GroupVersionKind())
	w.SetNamespace(ns)
	w.SetName(name)
	if err := cl.Patch(ctx, w, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("writing %s/%s: %v", ns, name, err)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(created.GroupVersionKind())
	if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, got); err != nil {
		t.Fatal(err)
	}
	if got.GetLabels()["realolm-write"] != label {
		t.Fatalf("%s/%s: the write did not land: labels %v", ns, name, got.GetLabels())
	}
	if d := cmp.Diff(created.Object["spec"], got.Object["spec"]); d != "" {
		t.Errorf("%s/%s lost fields after the write %s (-created +stored):\n%s", ns, name, label, d)
	}
}

// setUpgradeable writes the operator's Upgradeable condition into its
// OperatorCondition, as the operator's reporter does (internal/manager,
// with operator-lib's conditions package: spec.conditions), and waits for
// OLM to take it into the status it reads.
func setUpgradeable(t *testing.T, cl client.Client, ns, name string, status metav1.ConditionStatus, reason, message string) {
	t.Helper()
	if message == "" {
		message = reason
	}
	eventually(t, 60*time.Second, func() error {
		var oc operatorsv2.OperatorCondition
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &oc); err != nil {
			return err
		}
		meta.SetStatusCondition(&oc.Spec.Conditions, metav1.Condition{Type: operatorsv2.Upgradeable, Status: status, Reason: reason, Message: message})
		return cl.Update(ctx, &oc)
	})
	eventually(t, 60*time.Second, func() error {
		var oc operatorsv2.OperatorCondition
		if err := cl.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &oc); err != nil {
			return err
		}
		c := meta.FindStatusCondition(oc.Status.Conditions, operatorsv2.Upgradeable)
		if c == nil || c.Status != status || c.ObservedGeneration != oc.Generation {
			return fmt.Errorf("OperatorCondition %s/%s status %+v, want Upgradeable=%s at generation %d", ns, name, c, status, oc.Generation)
		}
		return nil
	})
}
