package helmreconciler_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/helmreconciler"
	"github.com/model-orchestra/operator/internal/manager"
	"github.com/model-orchestra/operator/internal/render"
)

func TestInstallUpgradeUninstall(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()

	create(t, newCR(sampleGVK, ns, "demo", map[string]any{"greeting": "hi"}))
	cr := waitDeployed(t, sampleGVK, ns, "demo", 1)
	for _, typ := range []string{"Initialized", "Deployed"} {
		if c := condition(cr, typ); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("condition %s = %+v, want True", typ, c)
		}
	}
	for _, typ := range []string{"ReleaseFailed", "Irreconcilable"} {
		if c := condition(cr, typ); c == nil || c.Status != metav1.ConditionFalse {
			t.Errorf("condition %s = %+v, want False", typ, c)
		}
	}
	dr, _, _ := unstructured.NestedMap(cr.Object, "status", "deployedRelease")
	if dr["name"] != "demo" || dr["chart"] != "small" || dr["version"] != "0.1.0" || len(fmt.Sprint(dr["digest"])) != 32 {
		t.Errorf("status.deployedRelease = %v", dr)
	}
	if _, hasManifest := dr["manifest"]; hasManifest {
		t.Error("status.deployedRelease carries the manifest")
	}

	cm, ok := configMap(t, ns, "demo-config")
	if !ok || cm.Data["greeting"] != "hi" {
		t.Fatalf("ConfigMap = %v, want greeting hi", cm)
	}
	if ref := metav1.GetControllerOf(cm); ref == nil || ref.Kind != "Sample" || ref.UID != cr.GetUID() {
		t.Errorf("ConfigMap controller = %v, want the Sample", ref)
	}
	for k, v := range map[string]string{render.LabelInstance: "demo", render.LabelName: "small", render.LabelVersion: "1.0.0", render.LabelManagedBy: "Helm"} {
		if cm.Labels[k] != v {
			t.Errorf("ConfigMap label %s = %q, want %q", k, cm.Labels[k], v)
		}
	}
	role := &rbacv1.ClusterRole{}
	if err := k8s.Get(ctx, types.NamespacedName{Name: ns + "-demo-reader"}, role); err != nil {
		t.Fatalf("cluster-scoped object: %v", err)
	}
	if role.Annotations[render.AnnotationOwner] != ns+"/demo" || len(role.OwnerReferences) != 0 {
		t.Errorf("ClusterRole ownership = %v / %v, want owner annotations and no reference", role.Annotations, role.OwnerReferences)
	}
	if got := cr.GetFinalizers(); len(got) != 1 || got[0] != helmreconciler.Finalizer {
		t.Errorf("finalizers = %v", got)
	}
	// The install is told by the condition (no event: see the docs).
	if c := condition(cr, "Deployed"); c.Reason != "InstallSuccessful" {
		t.Errorf("Deployed reason = %s, want InstallSuccessful", c.Reason)
	}
	// operator-lib's instrumented handler exports the creation time.
	createdAt := map[string]string{"name": "demo", "namespace": ns, "group": sampleGVK.Group, "version": sampleGVK.Version, "kind": sampleGVK.Kind}
	if v, ok := gaugeValue(t, "resource_created_at_seconds", createdAt); !ok || int64(v) != cr.GetCreationTimestamp().Unix() {
		t.Errorf("resource_created_at_seconds = %v (found %v), want %d", v, ok, cr.GetCreationTimestamp().Unix())
	}

	// The helm CLI sees the release.
	if out := helmCLI(t, "list", "-n", ns); !strings.Contains(out, "demo") || !strings.Contains(out, "deployed") || !strings.Contains(out, "small-0.1.0") {
		t.Errorf("helm list:\n%s", out)
	}

	// A spec change upgrades.
	update(t, sampleGVK, ns, "demo", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "bonjour", "spec", "greeting")
	})
	cr2 := waitDeployed(t, sampleGVK, ns, "demo", 2)
	if c := condition(cr2, "Deployed"); c.Reason != "UpgradeSuccessful" {
		t.Errorf("Deployed reason = %s, want UpgradeSuccessful", c.Reason)
	}
	if cm, _ := configMap(t, ns, "demo-config"); cm.Data["greeting"] != "bonjour" {
		t.Errorf("ConfigMap greeting = %q after the upgrade", cm.Data["greeting"])
	}
	waitEvent(t, ns, "demo", "UpgradeSuccessful")
	hist := helmCLI(t, "history", "demo", "-n", ns)
	if !strings.Contains(hist, "superseded") || strings.Count(hist, "small-0.1.0") != 2 {
		t.Errorf("helm history:\n%s", hist)
	}
	if vals := helmCLI(t, "get", "values", "demo", "-n", ns); !strings.Contains(vals, "greeting: bonjour") {
		t.Errorf("helm get values:\n%s", vals)
	}

	// Deleting uninstalls: objects, cluster-scoped ones and history go.
	if err := k8s.Delete(ctx, cr2); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, func() error {
		return gone(sampleGVK, ns, "demo")
	})
	if _, ok := configMap(t, ns, "demo-config"); ok {
		t.Error("ConfigMap left after uninstall")
	}
	if err := k8s.Get(ctx, types.NamespacedName{Name: ns + "-demo-reader"}, role); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRole left after uninstall: %v", err)
	}
	if s := releaseSecrets(t, ns); len(s) != 0 {
		t.Errorf("%d release Secrets left after uninstall", len(s))
	}
	waitEvent(t, ns, "demo", "UninstallSuccessful")
	eventually(t, 10*time.Second, func() error {
		if _, ok := gaugeValue(t, "resource_created_at_seconds", createdAt); ok {
			return errors.New("resource_created_at_seconds of the deleted resource is still exported")
		}
		return nil
	})
}

func TestNoOpReconcileDoesNotRender(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "quiet", map[string]any{"greeting": "hi"}))
	waitDeployed(t, sampleGVK, ns, "quiet", 1)

	pokeAndCheckNoOps(t, ns, "quiet", 1, 5)
	if len(releaseSecrets(t, ns)) != 1 {
		t.Error("no-op reconciles stored revisions")
	}
}

func TestDriftRepair(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	create(t, newCR(sampleGVK, ns, "drift", map[string]any{"greeting": "hi"}))
	waitDeployed(t, sampleGVK, ns, "drift", 1)

	// Deleted: recreated (the resync period is an hour, so the watch did it).
	cm, _ := configMap(t, ns, "drift-config")
	if err := k8s.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		return recreated(t, ns, "drift-config", cm.UID, "hi")
	})

	// Edited: the chart's field is restored, another writer's field stays.
	eventually(t, 10*time.Second, func() error {
		got, _ := configMap(t, ns, "drift-config")
		got.Data["greeting"] = "tampered"
		got.Data["added-by-someone"] = "keep me"
		got.Labels["team"] = "blue"
		return k8s.Update(ctx, got)
	})
	eventually(t, 20*time.Second, func() error {
		if got, _ := configMap(t, ns, "drift-config"); got.Data["greeting"] != "hi" {
			return fmt.Errorf("the edited greeting is not restored: data %v", got.Data)
		}
		return nil
	})
	got, _ := configMap(t, ns, "drift-config")
	if got.Data["added-by-someone"] != "keep me" || got.Labels["team"] != "blue" {
		t.Errorf("another writer's fields were dropped: data %v labels %v", got.Data, got.Labels)
	}
	// Deployment edited: replicas restored.
	eventually(t, 10*time.Second, func() error {
		d := &unstructured.Unstructured{}
		d.SetAPIVersion("apps/v1")
		d.SetKind("Deployment")
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "drift"}, d); err != nil {
			return err
		}
		_ = unstructured.SetNestedField(d.Object, int64(5), "spec", "replicas")
		return k8s.Update(ctx, d)
	})
	eventually(t, 20*time.Second, func() error {
		d := &unstructured.Unstructured{}
		d.SetAPIVersion("apps/v1")
		d.SetKind("Deployment")
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "drift"}, d); err != nil {
			return err
		}
		if r, _, _ := unstructured.NestedInt64(d.Object, "spec", "replicas"); r != 1 {
			return fmt.Errorf("the Deployment's replicas are %d, want them restored to 1", r)
		}
		return nil
	})
	// A cluster-scoped object, owned through annotations (no owner
	// reference is possible), is restored too.
	role := &rbacv1.ClusterRole{}
	if err := k8s.Get(ctx, types.NamespacedName{Name: ns + "-drift-reader"}, role); err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(ctx, role); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, func() error {
		got := &rbacv1.ClusterRole{}
		if err := k8s.Get(ctx, types.NamespacedName{Name: ns + "-drift-reader"}, got); err != nil {
			return fmt.Errorf("the deleted ClusterRole is not back: %w", err)
		}
		if got.UID == role.UID {
			return errors.New("the ClusterRole is still the deleted one")
		}
		return nil
	})
	waitEvent(t, ns, "drift", "DriftRepaired")
	if rev, _, _ := unstructured.NestedInt64(get(t, sampleGVK, ns, "drift").Object, "status", "deployedRelease", "revision"); rev != 1 {
		t.Errorf("drift repair made revision %d; it must not upgrade", rev)
	}
}

func TestInvalidValuesNameTheField(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "bad", map[string]any{"replicas": "three"}))
	cr := waitCondition(t, sampleGVK, ns, "bad", "Irreconcilable", metav1.ConditionTrue, "ValuesInvalid")
	if msg := condition(cr, "Irreconcilable").Message; !strings.Contains(msg, "/replicas") {
		t.Errorf("message %q does not name the field /replicas", msg)
	}
	if len(releaseSecrets(t, ns)) != 0 {
		t.Error("a release was stored for invalid values")
	}
	update(t, sampleGVK, ns, "bad", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, int64(3), "spec", "replicas")
	})
	cr = waitDeployed(t, sampleGVK, ns, "bad", 1)
	if c := condition(cr, "Irreconcilable"); c.Status != metav1.ConditionFalse {
		t.Errorf("Irreconcilable = %+v after fixing the values", c)
	}
}

func TestFailedInstallRemovesPartialRelease(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "broken", map[string]any{"breakApply": true}))
	cr := waitCondition(t, sampleGVK, ns, "broken", "ReleaseFailed", metav1.ConditionTrue, "InstallFailed")
	if msg := condition(cr, "ReleaseFailed").Message; !strings.Contains(msg, "partial release was removed") {
		t.Errorf("message %q does not say the partial release was removed", msg)
	}
	if c := condition(cr, "Deployed"); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("Deployed = %+v, want False", c)
	}
	waitEvent(t, ns, "broken", "InstallFailed")
	// Retries back off: each failed install writes and removes release
	// Secrets, whose watch events must not bring an immediate retry. After
	// the first failure the waits are 2 s, 4 s, 8 s..., so 9 s hold at
	// most 3 more attempts (at about 2 s and 6 s, and one of slack).
	failuresBefore := metricValue(t, "orchestra_helm_actions_total", map[string]string{"kind": "Sample", "action": "install", "result": "failure"})
	time.Sleep(9 * time.Second)
	if n := metricValue(t, "orchestra_helm_actions_total", map[string]string{"kind": "Sample", "action": "install", "result": "failure"}) - failuresBefore; n > 3 {
		t.Errorf("%v failed installs in 9 s after the first: retries do not back off", n)
	}
	// Between retries nothing of the failed install stays behind.
	eventually(t, 20*time.Second, func() error {
		if n := len(releaseSecrets(t, ns)); n != 0 {
			return fmt.Errorf("%d release Secrets stored between retries, want none", n)
		}
		return nil
	})
	update(t, sampleGVK, ns, "broken", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, false, "spec", "breakApply")
	})
	waitDeployed(t, sampleGVK, ns, "broken", 0)
}

// A failed upgrade rolls back to the last deployed revision with a normal
// (three-way merge) rollback: objects are patched, not replaced, so a Job
// (whose selector the API server set and keeps immutable) survives, and a
// field another writer set is kept. The release ends deployed with the old
// values.
func TestFailedUpgradeRollsBack(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "rb", map[string]any{"greeting": "v1", "job": true}))
	waitDeployed(t, sampleGVK, ns, "rb", 1)

	ctx := context.Background()
	job := &batchv1.Job{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rb-job"}, job); err != nil {
		t.Fatalf("getting the release's Job: %v", err)
	}
	cm, _ := configMap(t, ns, "rb-config")
	cm.Annotations = map[string]string{"other-writer": "kept"}
	if err := k8s.Update(ctx, cm); err != nil {
		t.Fatalf("annotating the ConfigMap as another writer: %v", err)
	}

	update(t, sampleGVK, ns, "rb", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "v2", "spec", "greeting")
		_ = unstructured.SetNestedField(u.Object, true, "spec", "breakApply")
	})
	cr := waitCondition(t, sampleGVK, ns, "rb", "ReleaseFailed", metav1.ConditionTrue, "UpgradeFailed")
	if msg := condition(cr, "ReleaseFailed").Message; !strings.Contains(msg, "rolled back to revision 1") {
		t.Errorf("message %q does not report the rollback", msg)
	}
	waitEvent(t, ns, "rb", "RollbackSuccessful")
	if c := condition(cr, "Deployed"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("Deployed = %+v; the rolled-back release is deployed", c)
	}
	// The engine retries the upgrade (with back-off) while the resource
	// asks for it; pausing stops that, so that what follows reads a
	// settled release.
	update(t, sampleGVK, ns, "rb", func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{helmreconciler.AnnotationPauseReconcile: "true"})
	})
	waitCondition(t, sampleGVK, ns, "rb", "Paused", metav1.ConditionTrue, "PauseReconcileAnnotationTrue")
	cm, _ = configMap(t, ns, "rb-config")
	if cm.Data["greeting"] != "v1" {
		t.Errorf("greeting = %q after rollback, want v1", cm.Data["greeting"])
	}
	if cm.Annotations["other-writer"] != "kept" {
		t.Errorf("the rollback replaced the ConfigMap: another writer's annotation is gone (annotations %v)", cm.Annotations)
	}
	after := &batchv1.Job{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "rb-job"}, after); err != nil {
		t.Fatalf("getting the Job after the rollback: %v", err)
	}
	if after.UID != job.UID {
		t.Errorf("the rollback recreated the Job (uid %s, was %s)", after.UID, job.UID)
	}
	hist := helmCLI(t, "history", "rb", "-n", ns)
	if !strings.Contains(hist, "failed") || !strings.Contains(hist, "Rollback to 1") {
		t.Errorf("helm history does not show the failed upgrade and the rollback:\n%s", hist)
	}
	if st := helmCLI(t, "status", "rb", "-n", ns); !strings.Contains(st, "STATUS: deployed") {
		t.Errorf("helm status after the rollback:\n%s", st)
	}
	if vals := helmCLI(t, "get", "values", "rb", "-n", ns); !strings.Contains(vals, "greeting: v1") || strings.Contains(vals, "breakApply") {
		t.Errorf("helm get values after the rollback shows other than the old values:\n%s", vals)
	}
}

// storeRelease writes a release record as an operator killed mid-action
// leaves it.
func storeRelease(t *testing.T, ns string, rel *release.Release) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		t.Fatal(err)
	}
	store := storage.Init(driver.NewSecrets(cs.CoreV1().Secrets(ns)))
	if err := store.Create(rel); err != nil {
		t.Fatalf("storing release: %v", err)
	}
}

func TestPendingInstallIsRecovered(t *testing.T) {
	ns := newNamespace(t)
	create(t, newCR(sampleGVK, ns, "crashed", map[string]any{"greeting": "hi"}))
	// An operator was killed during the install: revision 1 is
	// pending-install, and one object of it already exists.
	storeRelease(t, ns, &release.Release{
		Name: "crashed", Namespace: ns, Version: 1,
		Info:     &release.Info{Status: release.StatusPendingInstall, Description: "Initial install underway"},
		Chart:    &chart.Chart{Metadata: &chart.Metadata{Name: "small", Version: "0.1.0", APIVersion: "v2"}},
		Config:   map[string]any{"greeting": "hi"},
		Manifest: "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: crashed-config\ndata:\n  greeting: half\n",
		Labels:   map[string]string{helmreconciler.LabelEngine: helmreconciler.EngineName},
	})
	create(t, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "crashed-config", Namespace: ns,
			Labels:      map[string]string{"app.kubernetes.io/managed-by": "Helm"},
			Annotations: map[string]string{"meta.helm.sh/release-name": "crashed", "meta.helm.sh/release-namespace": ns}},
		Data: map[string]string{"greeting": "half"},
	})

	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	waitDeployed(t, sampleGVK, ns, "crashed", 0)
	waitEvent(t, ns, "crashed", "ReleaseRecovered")
	if cm, _ := configMap(t, ns, "crashed-config"); cm.Data["greeting"] != "hi" {
		t.Errorf("greeting = %q, want the chart's", cm.Data["greeting"])
	}
	if out := helmCLI(t, "status", "crashed", "-n", ns); !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status:\n%s", out)
	}
}

// An install without hooks writes its release record once, deployed, before
// it creates the objects (see releaseDriver). An operator killed between the
// record and the objects leaves a deployed record whose objects are missing;
// the next one creates them from the record, without a new revision.
func TestKilledInstallIsCompletedFromItsRecord(t *testing.T) {
	ns := newNamespace(t)
	entries := loadEntries(t, sampleWatch)
	stop := startManager(t, entries, managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "cut", map[string]any{"greeting": "hi"}))
	waitDeployed(t, sampleGVK, ns, "cut", 1)
	stop()
	s := releaseSecrets(t, ns)
	if len(s) != 1 || s[0].Labels["status"] != "deployed" {
		t.Fatalf("release Secrets %v, want one deployed record", s)
	}
	if at, ok := s[0].Labels["modifiedAt"]; ok {
		t.Errorf("the install record was written twice (modifiedAt=%s), want once", at)
	}

	// The objects are removed, as if the operator had been killed right
	// after storing the record: the record is all that is left.
	ctx := context.Background()
	for _, o := range []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cut-config"}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "cut"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: ns + "-cut-reader"}},
	} {
		if err := k8s.Delete(ctx, o); err != nil {
			t.Fatalf("deleting %s: %v", o.GetName(), err)
		}
	}
	eventually(t, 30*time.Second, func() error {
		if _, ok := configMap(t, ns, "cut-config"); ok {
			return errors.New("the ConfigMap is not gone yet")
		}
		return nil
	})

	startManager(t, entries, managerOpts{namespaces: []string{ns}})
	eventually(t, 60*time.Second, func() error {
		cm, ok := configMap(t, ns, "cut-config")
		if !ok || cm.Data["greeting"] != "hi" {
			return fmt.Errorf("ConfigMap = %v, want it recreated with greeting hi", cm)
		}
		for _, o := range []client.Object{&appsv1.Deployment{}, &rbacv1.ClusterRole{}} {
			key := types.NamespacedName{Namespace: ns, Name: "cut"}
			if _, ok := o.(*rbacv1.ClusterRole); ok {
				key = types.NamespacedName{Name: ns + "-cut-reader"}
			}
			if err := k8s.Get(ctx, key, o); err != nil {
				return fmt.Errorf("%T %s: %w", o, key, err)
			}
		}
		return nil
	})
	waitEvent(t, ns, "cut", "DriftRepaired")
	if s := releaseSecrets(t, ns); len(s) != 1 || s[0].Labels["version"] != "1" {
		t.Errorf("release Secrets after the recovery: %d, want revision 1 alone", len(s))
	}
	if out := helmCLI(t, "status", "cut", "-n", ns); !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status:\n%s", out)
	}
}

func TestPendingUpgradeIsRecovered(t *testing.T) {
	ns := newNamespace(t)
	entries := loadEntries(t, sampleWatch)
	create(t, newCR(sampleGVK, ns, "stuck", map[string]any{"greeting": "one"}))
	// A first operator deploys revision 1 and is stopped.
	stop := startManager(t, entries, managerOpts{namespaces: []string{ns}})
	waitDeployed(t, sampleGVK, ns, "stuck", 1)
	stop()

	// It was killed while upgrading: revision 2 is pending-upgrade.
	storeRelease(t, ns, &release.Release{
		Name: "stuck", Namespace: ns, Version: 2,
		Info:   &release.Info{Status: release.StatusPendingUpgrade, Description: "Preparing upgrade"},
		Chart:  &chart.Chart{Metadata: &chart.Metadata{Name: "small", Version: "0.1.0", APIVersion: "v2"}},
		Config: map[string]any{"greeting": "two"},
		Labels: map[string]string{helmreconciler.LabelEngine: helmreconciler.EngineName},
	})
	update(t, sampleGVK, ns, "stuck", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "two", "spec", "greeting")
	})

	startManager(t, entries, managerOpts{namespaces: []string{ns}})
	waitDeployed(t, sampleGVK, ns, "stuck", 3)
	waitEvent(t, ns, "stuck", "ReleaseRecovered")
	if cm, _ := configMap(t, ns, "stuck-config"); cm.Data["greeting"] != "two" {
		t.Errorf("greeting = %q, want two", cm.Data["greeting"])
	}
	hist := helmCLI(t, "history", "stuck", "-n", ns)
	if !strings.Contains(hist, "marked failed by the operator") {
		t.Errorf("helm history does not show revision 2 marked failed:\n%s", hist)
	}
}

func TestUninstallWait(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	cr := newCR(sampleGVK, ns, "waiter", map[string]any{})
	cr.SetAnnotations(map[string]string{helmreconciler.AnnotationUninstallWait: "true"})
	create(t, cr)
	waitDeployed(t, sampleGVK, ns, "waiter", 1)

	// Another controller holds the ConfigMap with a finalizer.
	eventually(t, 10*time.Second, func() error {
		cm, _ := configMap(t, ns, "waiter-config")
		cm.Finalizers = append(cm.Finalizers, "example.com/hold")
		return k8s.Update(ctx, cm)
	})
	if err := k8s.Delete(ctx, get(t, sampleGVK, ns, "waiter")); err != nil {
		t.Fatal(err)
	}
	cr2 := waitCondition(t, sampleGVK, ns, "waiter", "Deployed", metav1.ConditionFalse, "WaitingForObjectsGone")
	if msg := condition(cr2, "Deployed").Message; !strings.Contains(msg, "ConfigMap "+ns+"/waiter-config") {
		t.Errorf("message %q does not name the remaining ConfigMap", msg)
	}
	eventually(t, 10*time.Second, func() error {
		cm, _ := configMap(t, ns, "waiter-config")
		cm.Finalizers = nil
		return k8s.Update(ctx, cm)
	})
	eventually(t, 30*time.Second, func() error {
		return gone(sampleGVK, ns, "waiter")
	})
	if s := releaseSecrets(t, ns); len(s) != 0 {
		t.Errorf("%d release Secrets left after uninstall-wait", len(s))
	}
}

func TestPauseReconcile(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	cr := newCR(sampleGVK, ns, "paused", map[string]any{})
	cr.SetAnnotations(map[string]string{helmreconciler.AnnotationPauseReconcile: "true"})
	create(t, cr)
	waitCondition(t, sampleGVK, ns, "paused", "Paused", metav1.ConditionTrue, "PauseReconcileAnnotationTrue")
	if len(releaseSecrets(t, ns)) != 0 {
		t.Error("a paused resource was installed")
	}
	update(t, sampleGVK, ns, "paused", func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{helmreconciler.AnnotationPauseReconcile: "false"})
	})
	u := waitDeployed(t, sampleGVK, ns, "paused", 1)
	if c := condition(u, "Paused"); c != nil {
		t.Errorf("Paused condition %+v kept after resuming", c)
	}
}

func TestSelectorAndTwoEntries(t *testing.T) {
	ns := newNamespace(t)
	entries := loadEntries(t, sampleWatch+`  selector:
    matchLabels: {tier: gold}
- group: test.modelorchestra.io
  version: v1
  kind: Other
  chart: other
  status: greeting-status
`)
	startManager(t, entries, managerOpts{namespaces: []string{ns}})

	gold := newCR(sampleGVK, ns, "gold", map[string]any{"greeting": "g"})
	gold.SetLabels(map[string]string{"tier": "gold"})
	create(t, gold)
	create(t, newCR(sampleGVK, ns, "iron", map[string]any{"greeting": "i"}))
	create(t, newCR(otherGVK, ns, "o1", map[string]any{"color": "red"}))

	waitDeployed(t, sampleGVK, ns, "gold", 1)
	o := waitDeployed(t, otherGVK, ns, "o1", 1)
	if cm, _ := configMap(t, ns, "o1-other"); cm.Data["color"] != "red" {
		t.Errorf("Other's ConfigMap = %v", cm)
	}
	if dr, _, _ := unstructured.NestedString(o.Object, "status", "deployedRelease", "chart"); dr != "other" {
		t.Errorf("Other's chart = %q", dr)
	}
	// The selector keeps the engine off iron entirely.
	iron := get(t, sampleGVK, ns, "iron")
	if len(iron.GetFinalizers()) != 0 || iron.Object["status"] != nil {
		t.Errorf("a resource outside the selector was touched: finalizers %v status %v", iron.GetFinalizers(), iron.Object["status"])
	}
	if _, ok := configMap(t, ns, "iron-config"); ok {
		t.Error("a resource outside the selector was installed")
	}
}

func TestStatusPluginFieldsAreKept(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch+"  status: greeting-status\n"), managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "st", map[string]any{"greeting": "salut"}))
	var cr *unstructured.Unstructured
	eventually(t, 60*time.Second, func() error {
		cr = get(t, sampleGVK, ns, "st")
		if g, _, _ := unstructured.NestedString(cr.Object, "status", "greeting"); g != "salut" {
			return fmt.Errorf("want the status plugin's greeting salut; status %s", describe(cr))
		}
		return nil
	})
	if n, _, _ := unstructured.NestedInt64(cr.Object, "status", "objects"); n != 3 {
		t.Errorf("status.objects = %d, want 3 live objects", n)
	}
	if c := condition(cr, "GreetingPublished"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("plugin condition = %+v", c)
	}
	if c := condition(cr, "Deployed"); c == nil || c.Status != metav1.ConditionTrue {
		t.Errorf("engine condition Deployed = %+v next to the plugin's fields", c)
	}
	if _, ok, _ := unstructured.NestedMap(cr.Object, "status", "deployedRelease"); !ok {
		t.Error("deployedRelease missing next to the plugin's fields")
	}
	// An upgrade keeps them too.
	update(t, sampleGVK, ns, "st", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "hola", "spec", "greeting")
	})
	eventually(t, 60*time.Second, func() error {
		cr = get(t, sampleGVK, ns, "st")
		g, _, _ := unstructured.NestedString(cr.Object, "status", "greeting")
		rev, _, _ := unstructured.NestedInt64(cr.Object, "status", "deployedRelease", "revision")
		if g != "hola" || rev != 2 {
			return fmt.Errorf("want the plugin's greeting hola at revision 2; status %s", describe(cr))
		}
		return nil
	})
}

func TestWatchNamespace(t *testing.T) {
	served, ignored := newNamespace(t), newNamespace(t)
	t.Setenv(manager.EnvWatchNamespace, " "+served+" ,")
	cfgNamespaces := manager.Default().WatchNamespaces
	if len(cfgNamespaces) != 1 || cfgNamespaces[0] != served {
		t.Fatalf("WATCH_NAMESPACE parsed as %v", cfgNamespaces)
	}
	// The resource outside is created first: by the time the one inside is
	// deployed, the engine would have taken the outside one too.
	create(t, newCR(sampleGVK, ignored, "outside", map[string]any{}))
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: cfgNamespaces})
	create(t, newCR(sampleGVK, served, "inside", map[string]any{}))
	waitDeployed(t, sampleGVK, served, "inside", 1)
	if u := get(t, sampleGVK, ignored, "outside"); u.Object["status"] != nil || len(u.GetFinalizers()) != 0 {
		t.Errorf("a resource outside WATCH_NAMESPACE was reconciled: %s", describe(u))
	}
}

func TestChunkedReleaseOnCluster(t *testing.T) {
	ns := newNamespace(t)
	// A small chunk size makes this small release span several Secrets,
	// as a release over 1 MiB does with the default size.
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}, chunkSize: 1024})
	padding := make([]byte, 3072)
	_, _ = rand.Read(padding) // incompressible, unlike a repeated letter
	create(t, newCR(sampleGVK, ns, "chunky", map[string]any{"padding": base64.StdEncoding.EncodeToString(padding)}))
	waitDeployed(t, sampleGVK, ns, "chunky", 1)
	list := &corev1.SecretList{}
	if err := k8s.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{"modelorchestra.io/release-chunk-of": "chunky"}); err != nil {
		t.Fatal(err)
	}
	if len(list.Items) == 0 {
		t.Fatal("the release was not chunked")
	}
	update(t, sampleGVK, ns, "chunky", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, "again", "spec", "greeting")
	})
	waitDeployed(t, sampleGVK, ns, "chunky", 2)
	if cm, _ := configMap(t, ns, "chunky-config"); cm.Data["greeting"] != "again" {
		t.Errorf("greeting = %q after upgrading a chunked release", cm.Data["greeting"])
	}
}

func TestBadReconcilePeriodAnnotation(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	cr := newCR(sampleGVK, ns, "period", map[string]any{})
	cr.SetAnnotations(map[string]string{helmreconciler.AnnotationReconcilePeriod: "often"})
	create(t, cr)
	u := waitCondition(t, sampleGVK, ns, "period", "Irreconcilable", metav1.ConditionTrue, "ReconcileError")
	if msg := condition(u, "Irreconcilable").Message; !strings.Contains(msg, helmreconciler.AnnotationReconcilePeriod) {
		t.Errorf("message %q does not name the annotation", msg)
	}
}

func TestManagerStoppedMidInstallConverges(t *testing.T) {
	ns := newNamespace(t)
	entries := loadEntries(t, sampleWatch)
	stop := startManager(t, entries, managerOpts{namespaces: []string{ns}})
	create(t, newCR(sampleGVK, ns, "midway", map[string]any{"slowHook": true}))
	eventually(t, 60*time.Second, func() error {
		list := &corev1.SecretList{}
		if err := k8s.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{"owner": "helm", "status": "pending-install"}); err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d pending-install release Secrets, want 1 (the install underway)", len(list.Items))
		}
		return nil
	})
	stop() // the operator goes away in the middle of the install

	// Helm marks the interrupted install failed (a killed operator leaves it
	// pending-install, see TestPendingInstallIsRecovered); either way the
	// stopping operator leaves it for the next one.
	if s := releaseSecrets(t, ns); len(s) != 1 || (s[0].Labels["status"] != "failed" && s[0].Labels["status"] != "pending-install") {
		t.Fatalf("after the shutdown the release Secrets are %d (status %q), want the interrupted install left behind", len(s), s[0].Labels["status"])
	}
	update(t, sampleGVK, ns, "midway", func(u *unstructured.Unstructured) {
		_ = unstructured.SetNestedField(u.Object, false, "spec", "slowHook")
	})
	startManager(t, entries, managerOpts{namespaces: []string{ns}})
	waitDeployed(t, sampleGVK, ns, "midway", 0)
	waitEvent(t, ns, "midway", "ReleaseRecovered")
	if out := helmCLI(t, "status", "midway", "-n", ns); !strings.Contains(out, "STATUS: deployed") {
		t.Errorf("helm status:\n%s", out)
	}
}

func TestUpgradeForceReplacesObjects(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	forced := newCR(sampleGVK, ns, "forced", map[string]any{"greeting": "a"})
	forced.SetAnnotations(map[string]string{helmreconciler.AnnotationUpgradeForce: "true"})
	create(t, forced)
	create(t, newCR(sampleGVK, ns, "patched", map[string]any{"greeting": "a"}))
	for _, name := range []string{"forced", "patched"} {
		waitDeployed(t, sampleGVK, ns, name, 1)
		// Another writer labels the ConfigMap.
		eventually(t, 10*time.Second, func() error {
			cm, _ := configMap(t, ns, name+"-config")
			cm.Labels["team"] = "blue"
			return k8s.Update(ctx, cm)
		})
		update(t, sampleGVK, ns, name, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "b", "spec", "greeting")
		})
		waitDeployed(t, sampleGVK, ns, name, 2)
	}
	// A forced upgrade replaces the object (the other writer's label goes);
	// a normal one patches it (the label stays).
	if cm, _ := configMap(t, ns, "forced-config"); cm.Data["greeting"] != "b" || cm.Labels["team"] != "" {
		t.Errorf("forced upgrade: greeting %q, team label %q; want b and the object replaced", cm.Data["greeting"], cm.Labels["team"])
	}
	if cm, _ := configMap(t, ns, "patched-config"); cm.Data["greeting"] != "b" || cm.Labels["team"] != "blue" {
		t.Errorf("normal upgrade: greeting %q, team label %q; want b and the label kept", cm.Data["greeting"], cm.Labels["team"])
	}
}

// With watchDependentResources: false the engine does not watch what it
// owns: a deleted owned object stays deleted until the resource's next
// reconcile (here made by an annotation change; the resync period is an
// hour), while with the default (TestDriftRepair) the watch restores it
// at once.
func TestUnwatchedDependentsWaitForTheNextReconcile(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch+"  watchDependentResources: false\n"), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	create(t, newCR(sampleGVK, ns, "unwatched", map[string]any{"greeting": "hi"}))
	waitDeployed(t, sampleGVK, ns, "unwatched", 1)
	// Let the reconciles that the install's own writes queued run first.
	pokeAndCheckNoOps(t, ns, "unwatched", 1, 1)

	cm, _ := configMap(t, ns, "unwatched-config")
	if err := k8s.Delete(ctx, cm); err != nil {
		t.Fatal(err)
	}
	// A watch restores a deleted object within a second or so; give it
	// five and check, all along, that nothing restores it.
	consistently(t, 5*time.Second, func() error {
		if got, ok := configMap(t, ns, "unwatched-config"); ok {
			return fmt.Errorf("the deleted ConfigMap came back (uid %s) without a reconcile of its owner, yet no watch is on its kind", got.UID)
		}
		return nil
	})

	// The next reconcile of the owner restores it.
	update(t, sampleGVK, ns, "unwatched", func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{"example.com/poke": "restore"})
	})
	eventually(t, 20*time.Second, func() error {
		return recreated(t, ns, "unwatched-config", cm.UID, "hi")
	})
}

// An engine running under its own ServiceAccount, as in a cluster, may
// create a RoleBinding only once the API server can read the Role it binds
// (the escalation check): the Role is created before the binding, as Helm
// orders them, even though the engine creates most objects at once.
func TestRoleBindingUnderOperatorIdentity(t *testing.T) {
	ns := newNamespace(t)
	ctx := context.Background()
	// Every verb on everything except bind and escalate: the engine may
	// bind a Role only because it holds the Role's permissions.
	name := ns + "-operator"
	rules := []rbacv1.PolicyRule{{
		APIGroups: []string{"*"}, Resources: []string{"*"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"},
	}}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "operator"}}
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "operator"}},
	}
	for _, o := range []client.Object{sa, cr, crb} {
		create(t, o)
	}
	t.Cleanup(func() {
		_ = k8s.Delete(ctx, crb) // best effort: the namespace goes too
		_ = k8s.Delete(ctx, cr)
	})

	startManager(t, loadEntries(t, sampleWatch), managerOpts{
		namespaces: []string{ns},
		config:     testCluster.ImpersonateServiceAccount(ns, "operator"),
	})
	create(t, newCR(sampleGVK, ns, "bound", map[string]any{"roleBinding": true}))
	got := waitDeployed(t, sampleGVK, ns, "bound", 1)
	if c := condition(got, "ReleaseFailed"); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("ReleaseFailed = %+v, want False", c)
	}
	rb := &rbacv1.RoleBinding{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "bound-reader"}, rb); err != nil {
		t.Fatalf("RoleBinding: %v", err)
	}
	// The first install attempt succeeded: no failure event was recorded.
	events := &corev1.EventList{}
	if err := k8s.List(ctx, events, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == "bound" && e.Type == corev1.EventTypeWarning {
			t.Errorf("warning event %s: %s", e.Reason, e.Message)
		}
	}
}

// The API server leaves out zero values of omitempty fields (the small
// chart's Deployment spells out stdin: false and a volume's readOnly:
// false) and defaults others: neither is drift. Once the Deployment has
// changed on the server (its status, by kube-controller-manager),
// reconciles of the resource restore nothing and record no repair.
func TestServerNormalizationIsNotDrift(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	create(t, newCR(sampleGVK, ns, "normal", map[string]any{}))
	waitDeployed(t, sampleGVK, ns, "normal", 1)
	eventually(t, 30*time.Second, func() error {
		d := &appsv1.Deployment{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "normal"}, d); err != nil {
			return err
		}
		if d.Status.ObservedGeneration == 0 {
			return errors.New("kube-controller-manager has not updated the Deployment's status")
		}
		return nil
	})
	repairs := func() float64 {
		return metricValue(t, "orchestra_helm_drift_repairs_total", map[string]string{"kind": "Sample"})
	}
	reconciles := func() float64 {
		return histogramCount(t, "orchestra_helm_reconcile_duration_seconds", map[string]string{"kind": "Sample"})
	}
	repairsBefore := repairs()
	for i := range 3 {
		before := reconciles()
		update(t, sampleGVK, ns, "normal", func(u *unstructured.Unstructured) {
			u.SetAnnotations(map[string]string{"example.com/poke": fmt.Sprint(i)})
		})
		eventually(t, 30*time.Second, func() error {
			if reconciles() == before {
				return fmt.Errorf("no reconcile of poke %d yet", i)
			}
			return nil
		})
	}
	// Nor do the reconciles that follow (status changes of the objects).
	consistently(t, 3*time.Second, func() error {
		if got := repairs(); got != repairsBefore {
			return fmt.Errorf("drift repairs went from %v to %v with nothing changed by anyone", repairsBefore, got)
		}
		if reasons := eventReasons(t, ns, "normal"); slices.Contains(reasons, "DriftRepaired") {
			return fmt.Errorf("events %v: a DriftRepaired event with nothing changed", reasons)
		}
		return nil
	})
	// The engine learned the server's form from its answer to the create:
	// it never applied the unchanged objects (an apply would have added
	// its field manager to them).
	for _, o := range []client.Object{&appsv1.Deployment{}, &corev1.ConfigMap{}} {
		name := "normal"
		if _, ok := o.(*corev1.ConfigMap); ok {
			name = "normal-config"
		}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, o); err != nil {
			t.Fatal(err)
		}
		for _, mf := range o.GetManagedFields() {
			if mf.Operation == metav1.ManagedFieldsOperationApply {
				t.Errorf("%T %s was applied by %q after the install with nothing changed", o, name, mf.Manager)
			}
		}
	}
}

// An install does not read the objects it is about to create when the
// operator's cache, which watches their kinds, shows they do not exist.
// An object that exists without Helm's labels is not in that cache: the
// install then fails at create, and the purge of the failed install
// deletes what the install created and leaves that object as it was.
func TestInstallSkipsReadsOfObjectsTheCacheShowsAbsent(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}, countAPIRequests: true})
	create(t, newCR(sampleGVK, ns, "first", nil))
	waitDeployed(t, sampleGVK, ns, "first", 1)
	reads := func() float64 {
		return metricValue(t, "orchestra_api_requests_total", map[string]string{"verb": "get", "resource": "configmaps"}) +
			metricValue(t, "orchestra_api_requests_total", map[string]string{"verb": "get", "resource": "deployments"})
	}
	before := reads()
	create(t, newCR(sampleGVK, ns, "second", nil))
	waitDeployed(t, sampleGVK, ns, "second", 1)
	if n := reads() - before; n != 0 {
		t.Errorf("the second install read %v ConfigMaps and Deployments; want none (the cache shows they do not exist)", n)
	}

	foreign := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "third-config"},
		Data:       map[string]string{"owner": "someone else"},
	}
	create(t, foreign)
	create(t, newCR(sampleGVK, ns, "third", nil))
	cr := waitCondition(t, sampleGVK, ns, "third", "ReleaseFailed", metav1.ConditionTrue, "InstallFailed")
	if msg := condition(cr, "ReleaseFailed").Message; !strings.Contains(msg, "third-config") {
		t.Errorf("ReleaseFailed message %q does not name the existing ConfigMap", msg)
	}
	// The purge ran (the Deployment the install created is gone) and kept
	// the ConfigMap it did not create.
	eventually(t, 20*time.Second, func() error {
		return gone(appsv1.SchemeGroupVersion.WithKind("Deployment"), ns, "third")
	})
	consistently(t, 2*time.Second, func() error {
		cm, ok := configMap(t, ns, "third-config")
		if !ok {
			return errors.New("the existing ConfigMap was deleted")
		}
		if cm.Data["owner"] != "someone else" || cm.Labels[helmreconciler.LabelManagedBy] != "" {
			return fmt.Errorf("the existing ConfigMap was changed: data %v, labels %v", cm.Data, cm.Labels)
		}
		return nil
	})
}

// A release whose objects all carry the resource's owner reference needs no
// finalizer: deleting the resource leaves the objects and the history to the
// garbage collector. A resource created again under the same name at once
// waits for that, and then installs its own release. (It waits for the
// garbage collector of a fresh control plane, which learns of the test CRD
// at its next discovery, up to 30 s after the CRD was created: hence the
// long waits, and the place of this test at the end of the file.)
func TestOwnedReleaseNeedsNoFinalizer(t *testing.T) {
	ns := newNamespace(t)
	startManager(t, loadEntries(t, sampleWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	values := map[string]any{"greeting": "hi", "clusterRole": false}
	create(t, newCR(sampleGVK, ns, "plain", values))
	cr := waitDeployed(t, sampleGVK, ns, "plain", 1)
	if f := cr.GetFinalizers(); len(f) != 0 {
		t.Errorf("finalizers %v, want none: the release has only owned objects", f)
	}
	first := cr.GetUID()

	// Deleted and created again at once: the new resource's release is
	// its own, and so are its objects.
	if err := k8s.Delete(ctx, cr); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, func() error { return gone(sampleGVK, ns, "plain") })
	create(t, newCR(sampleGVK, ns, "plain", values))
	var again *unstructured.Unstructured
	eventually(t, 90*time.Second, func() error {
		again = get(t, sampleGVK, ns, "plain")
		if c := condition(again, "Deployed"); c == nil || c.Status != metav1.ConditionTrue {
			return fmt.Errorf("the new resource is not deployed: %s", describe(again))
		}
		return nil
	})
	if again.GetUID() == first {
		t.Fatal("the resource was not created again")
	}
	eventually(t, 10*time.Second, func() error {
		cm, ok := configMap(t, ns, "plain-config")
		if !ok {
			return errors.New("no ConfigMap")
		}
		if ref := metav1.GetControllerOf(cm); ref == nil || ref.UID != again.GetUID() {
			return fmt.Errorf("ConfigMap controller %v, want the new resource %s", ref, again.GetUID())
		}
		s := releaseSecrets(t, ns)
		if len(s) != 1 {
			return fmt.Errorf("%d release Secrets, want the new resource's one", len(s))
		}
		if ref := metav1.GetControllerOf(&s[0]); ref == nil || ref.UID != again.GetUID() {
			return fmt.Errorf("release Secret controller %v, want the new resource %s", ref, again.GetUID())
		}
		return nil
	})

	// Deleting it removes everything, by garbage collection.
	if err := k8s.Delete(ctx, again); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, func() error {
		if _, ok := configMap(t, ns, "plain-config"); ok {
			return errors.New("ConfigMap left")
		}
		switch err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "plain"}, &appsv1.Deployment{}); {
		case err == nil:
			return errors.New("Deployment left")
		case !apierrors.IsNotFound(err):
			return err
		}
		if s := releaseSecrets(t, ns); len(s) != 0 {
			return fmt.Errorf("%d release Secrets left", len(s))
		}
		return nil
	})
}
