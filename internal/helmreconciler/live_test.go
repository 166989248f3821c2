package helmreconciler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

const stampWatch = sampleWatch + `  postRenderers:
    - name: secret-stamp
`

// stampOf returns the secret-stamp annotation of the Deployment's pod
// template.
func stampOf(t *testing.T, ns, name string) string {
	t.Helper()
	d := &unstructured.Unstructured{}
	d.SetAPIVersion("apps/v1")
	d.SetKind("Deployment")
	if err := k8s.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, d); err != nil {
		t.Fatalf("getting Deployment %s: %v", name, err)
	}
	s, _, _ := unstructured.NestedString(d.Object, "spec", "template", "metadata", "annotations", stampAnnotation)
	return s
}

func revisionOf(t *testing.T, ns, name string) int64 {
	t.Helper()
	rev, _, _ := unstructured.NestedInt64(get(t, sampleGVK, ns, name).Object, "status", "deployedRelease", "revision")
	return rev
}

// pokeAndCheckNoOp makes reconciles that change no input and checks that
// they render nothing and upgrade nothing.
func pokeAndCheckNoOp(t *testing.T, ns, name string, rev int64) {
	t.Helper()
	pokeAndCheckNoOps(t, ns, name, rev, 3)
}

// pokeAndCheckNoOps makes n reconciles that change no input, one at a
// time, and checks that they render nothing and leave revision rev.
func pokeAndCheckNoOps(t *testing.T, ns, name string, rev int64, n int) {
	t.Helper()
	noops := func() float64 {
		return histogramCount(t, "orchestra_helm_reconcile_duration_seconds", map[string]string{"kind": "Sample", "outcome": "noop"})
	}
	before := noops()
	rendersBefore := metricValue(t, "orchestra_helm_renders_total", map[string]string{"kind": "Sample"})
	// One poke at a time: the work queue merges events for a resource that
	// is already queued, so quick pokes may make fewer reconciles.
	for i := range n {
		update(t, sampleGVK, ns, name, func(u *unstructured.Unstructured) {
			a := u.GetAnnotations()
			if a == nil {
				a = map[string]string{}
			}
			a["example.com/poke"] = fmt.Sprint(i)
			u.SetAnnotations(a)
		})
		eventually(t, 30*time.Second, func() error {
			if n := noops() - before; n < float64(i+1) {
				return fmt.Errorf("%v no-op reconciles after %d pokes", n, i+1)
			}
			return nil
		})
	}
	if after := metricValue(t, "orchestra_helm_renders_total", map[string]string{"kind": "Sample"}); after != rendersBefore {
		t.Errorf("renders went from %v to %v on reconciles that changed nothing", rendersBefore, after)
	}
	if got := revisionOf(t, ns, name); got != rev {
		t.Errorf("revision = %d after no-op reconciles, want %d", got, rev)
	}
}

func TestChangedLiveInputUpgradesPromptly(t *testing.T) {
	ns := newNamespace(t)
	// The resync period is an hour: only the watch of the Secret can bring
	// the upgrades below in time.
	startManager(t, loadEntries(t, stampWatch), managerOpts{namespaces: []string{ns}})
	ctx := context.Background()
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "app-token", Namespace: ns},
		Data:       map[string][]byte{"token": []byte("one")},
	}
	create(t, secret)
	create(t, newCR(sampleGVK, ns, "app", map[string]any{"greeting": "hi"}))
	waitDeployed(t, sampleGVK, ns, "app", 1)
	first := stampOf(t, ns, "app")
	if first == "" || first == "absent" {
		t.Fatalf("stamp after install = %q; the render did not read the user's Secret", first)
	}

	// With a live input, a reconcile that changes nothing still renders
	// nothing (and an install is not followed by an upgrade).
	pokeAndCheckNoOp(t, ns, "app", 1)

	// Editing the Secret upgrades, and the pod template changes (pods roll).
	eventually(t, 10*time.Second, func() error {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "app-token"}, s); err != nil {
			return err
		}
		s.Data["token"] = []byte("two")
		return k8s.Update(ctx, s)
	})
	cr := waitDeployed(t, sampleGVK, ns, "app", 2)
	if c := condition(cr, "Deployed"); c.Reason != "UpgradeSuccessful" {
		t.Errorf("Deployed reason = %s, want UpgradeSuccessful", c.Reason)
	}
	second := stampOf(t, ns, "app")
	if second == first || second == "absent" {
		t.Errorf("stamp %q after the Secret changed, was %q; the pods would not roll", second, first)
	}
	pokeAndCheckNoOp(t, ns, "app", 2)

	// Deleting it is a change too.
	if err := k8s.Delete(ctx, secret); err != nil {
		t.Fatal(err)
	}
	waitDeployed(t, sampleGVK, ns, "app", 3)
	if got := stampOf(t, ns, "app"); got != "absent" {
		t.Errorf("stamp %q after the Secret was deleted, want absent", got)
	}
}

func TestLiveInputsAcrossRestart(t *testing.T) {
	ns := newNamespace(t)
	entries := loadEntries(t, stampWatch)
	ctx := context.Background()
	create(t, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "app-token", Namespace: ns},
		Data:       map[string][]byte{"token": []byte("one")},
	})
	create(t, newCR(sampleGVK, ns, "app", map[string]any{}))
	stop := startManager(t, entries, managerOpts{namespaces: []string{ns}})
	waitDeployed(t, sampleGVK, ns, "app", 1)
	first := stampOf(t, ns, "app")
	stop()

	// A new operator finds the release up to date: the stored digest
	// covers the live inputs as they were read.
	stop = startManager(t, entries, managerOpts{namespaces: []string{ns}})
	pokeAndCheckNoOp(t, ns, "app", 1)
	stop()

	// The Secret changes while no operator runs: the next one upgrades.
	eventually(t, 10*time.Second, func() error {
		s := &corev1.Secret{}
		if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "app-token"}, s); err != nil {
			return err
		}
		s.Data["token"] = []byte("two")
		return k8s.Update(ctx, s)
	})
	startManager(t, entries, managerOpts{namespaces: []string{ns}})
	waitDeployed(t, sampleGVK, ns, "app", 2)
	if got := stampOf(t, ns, "app"); got == first {
		t.Errorf("stamp unchanged (%q) after the Secret changed while the operator was down", got)
	}
}
