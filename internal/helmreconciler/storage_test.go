package helmreconciler

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"sync"
	"testing"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// secretLimit is the API server's limit on a Secret's data.
const secretLimit = 1 << 20

// fakeSecrets returns a clientset that refuses Secrets over the API
// server's size limit, as a real cluster does.
func fakeSecrets(t *testing.T) *fake.Clientset {
	t.Helper()
	cs := fake.NewClientset()
	refuse := func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(interface{ GetObject() runtime.Object }).GetObject().(*corev1.Secret)
		size := 0
		for _, v := range s.Data {
			size += len(v)
		}
		if size > secretLimit {
			return true, nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf("Secret %q is invalid: data: Too long: must have at most %d bytes", s.Name, secretLimit))
		}
		return false, nil, nil
	}
	cs.PrependReactor("create", "secrets", refuse)
	cs.PrependReactor("update", "secrets", refuse)
	return cs
}

// bigRelease returns a release whose encoded form is several MiB: random
// data does not compress.
func bigRelease(t *testing.T, name string, version int, size int) *release.Release {
	t.Helper()
	b := make([]byte, size)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return &release.Release{
		Name: name, Namespace: "ns", Version: version,
		Info:     &release.Info{Status: release.StatusDeployed},
		Chart:    &chart.Chart{Metadata: &chart.Metadata{Name: "big", Version: "1.0.0", APIVersion: "v2"}},
		Manifest: "# " + base64.StdEncoding.EncodeToString(b),
		Labels:   map[string]string{LabelDigest: "d1"},
	}
}

func TestReleaseOverOneMiBIsChunked(t *testing.T) {
	cs := fakeSecrets(t)
	owner := &metav1.OwnerReference{APIVersion: "x/v1", Kind: "X", Name: "big", UID: "u1", Controller: ptr(true)}
	newStore := func(wrap bool) *storage.Storage {
		var impl = cs.CoreV1().Secrets("ns")
		if wrap {
			return storage.Init(newReleaseDriver(&releaseSecrets{SecretInterface: impl, owner: owner, labels: map[string]string{LabelEngine: EngineName}, chunks: new(sync.Map)}, t.Logf))
		}
		return storage.Init(driver.NewSecrets(impl))
	}

	rel := bigRelease(t, "big", 1, 3<<20)
	if err := newStore(false).Create(rel); err == nil {
		t.Fatal("Helm's own driver stored a release over 1 MiB; the test does not exercise the limit")
	}

	store := newStore(true)
	if err := store.Create(rel); err != nil {
		t.Fatalf("storing a 3 MiB release: %v", err)
	}
	secrets, err := cs.CoreV1().Secrets("ns").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(secrets.Items) < 4 {
		t.Fatalf("got %d Secrets, want the release split over at least 4", len(secrets.Items))
	}
	for _, s := range secrets.Items {
		if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "u1" {
			t.Errorf("Secret %s owner references = %v, want the custom resource", s.Name, s.OwnerReferences)
		}
		if s.Labels[LabelEngine] != EngineName {
			t.Errorf("Secret %s lacks the engine label", s.Name)
		}
	}

	got, err := store.Get("big", 1)
	if err != nil {
		t.Fatalf("reading the chunked release: %v", err)
	}
	if got.Manifest != rel.Manifest || got.Labels[LabelDigest] != "d1" {
		t.Error("the chunked release does not read back unchanged")
	}
	hist, err := store.History("big")
	if err != nil || len(hist) != 1 || hist[0].Manifest != rel.Manifest {
		t.Fatalf("history of the chunked release: %d releases, %v", len(hist), err)
	}

	// A second, smaller revision and the supersession of the first.
	small := bigRelease(t, "big", 2, 10)
	if err := store.Create(small); err != nil {
		t.Fatal(err)
	}
	rel.Info.Status = release.StatusSuperseded
	if err := store.Update(rel); err != nil {
		t.Fatalf("updating the chunked release: %v", err)
	}
	if last, err := store.Last("big"); err != nil || last.Version != 2 {
		t.Fatalf("last revision = %v, %v", last, err)
	}

	// Deleting removes every chunk.
	for _, v := range []int{1, 2} {
		if _, err := store.Delete("big", v); err != nil {
			t.Fatalf("deleting revision %d: %v", v, err)
		}
	}
	secrets, _ = cs.CoreV1().Secrets("ns").List(t.Context(), metav1.ListOptions{})
	if len(secrets.Items) != 0 {
		t.Errorf("%d Secrets left after deleting every revision", len(secrets.Items))
	}
}

func TestSmallReleaseIsStoredAsHelmStoresIt(t *testing.T) {
	cs := fakeSecrets(t)
	store := storage.Init(driver.NewSecrets(&releaseSecrets{SecretInterface: cs.CoreV1().Secrets("ns")}))
	if err := store.Create(bigRelease(t, "small", 1, 100)); err != nil {
		t.Fatal(err)
	}
	// Helm's own driver, as the helm CLI uses it, reads it.
	plain := storage.Init(driver.NewSecrets(cs.CoreV1().Secrets("ns")))
	if _, err := plain.Get("small", 1); err != nil {
		t.Fatalf("helm's driver cannot read a small release: %v", err)
	}
	s, _ := cs.CoreV1().Secrets("ns").Get(t.Context(), "sh.helm.release.v1.small.v1", metav1.GetOptions{})
	if _, chunked := s.Labels[labelChunks]; chunked {
		t.Error("a small release was chunked")
	}
}

// One action configuration lists a release's history from the API server
// once until it writes: Helm's install reads the history twice more before
// its first write, and each list reads every Secret of the namespace.
func TestHistoryIsListedOnceUntilAWrite(t *testing.T) {
	cs := fakeSecrets(t)
	lists := 0
	cs.PrependReactor("list", "secrets", func(k8stesting.Action) (bool, runtime.Object, error) {
		lists++
		return false, nil, nil
	})
	store := storage.Init(driver.NewSecrets(&releaseSecrets{SecretInterface: cs.CoreV1().Secrets("ns")}))
	if err := store.Create(bigRelease(t, "r", 1, 100)); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if hist, err := store.History("r"); err != nil || len(hist) != 1 {
			t.Fatalf("history = %d releases, %v; want 1", len(hist), err)
		}
	}
	if lists != 1 {
		t.Errorf("three history reads without a write listed Secrets %d times, want 1", lists)
	}

	if err := store.Create(bigRelease(t, "r", 2, 100)); err != nil {
		t.Fatal(err)
	}
	if hist, err := store.History("r"); err != nil || len(hist) != 2 {
		t.Fatalf("history after storing revision 2 = %d releases, %v; want 2", len(hist), err)
	}
	if _, err := store.Delete("r", 2); err != nil {
		t.Fatal(err)
	}
	if hist, err := store.History("r"); err != nil || len(hist) != 1 {
		t.Fatalf("history after deleting revision 2 = %d releases, %v; want 1", len(hist), err)
	}
	if lists != 3 {
		t.Errorf("Secrets listed %d times, want 3 (once after each write)", lists)
	}

	// A new configuration (the next reconcile) reads the API server again.
	next := storage.Init(driver.NewSecrets(&releaseSecrets{SecretInterface: cs.CoreV1().Secrets("ns")}))
	if _, err := next.History("r"); err != nil {
		t.Fatal(err)
	}
	if lists != 4 {
		t.Errorf("a new configuration did not list Secrets afresh (%d lists, want 4)", lists)
	}
}

// The engine writes release records with its own encoding (a faster gzip
// level): the helm CLI's driver must read them as it reads its own, and
// they must carry the same labels and type.
func TestReleaseRecordsAreHelms(t *testing.T) {
	ch, err := loader.Load("../../charts/model-orchestra")
	if err != nil {
		t.Fatal(err)
	}
	rel := &release.Release{
		Name: "demo", Namespace: "ns", Version: 1,
		Info:     &release.Info{Status: release.StatusDeployed, Description: "Install complete"},
		Chart:    ch,
		Config:   map[string]any{"greeting": "hi"},
		Manifest: "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: demo\n",
		Labels:   map[string]string{LabelDigest: "d1"},
	}
	cs := fake.NewClientset()
	ours := storage.Init(newReleaseDriver(&releaseSecrets{SecretInterface: cs.CoreV1().Secrets("ns")}, t.Logf))
	helms := storage.Init(driver.NewSecrets(cs.CoreV1().Secrets("ns")))
	if err := ours.Create(rel); err != nil {
		t.Fatal(err)
	}
	other := *rel
	other.Name = "helm"
	if err := helms.Create(&other); err != nil {
		t.Fatal(err)
	}
	got, err := helms.Get("demo", 1)
	if err != nil {
		t.Fatalf("Helm's driver cannot read the engine's record: %v", err)
	}
	if got.Info.Status != release.StatusDeployed || got.Manifest != rel.Manifest || got.Chart.Metadata.Version != ch.Metadata.Version ||
		len(got.Chart.Templates) != len(ch.Templates) || got.Config["greeting"] != "hi" || got.Labels[LabelDigest] != "d1" {
		t.Errorf("Helm's driver read back %+v", got)
	}

	// Same type and label keys as Helm's own record; updates too.
	rel.Info.Status = release.StatusSuperseded
	if err := ours.Update(rel); err != nil {
		t.Fatal(err)
	}
	other.Info.Status = release.StatusSuperseded
	if err := helms.Update(&other); err != nil {
		t.Fatal(err)
	}
	mine, _ := cs.CoreV1().Secrets("ns").Get(t.Context(), "sh.helm.release.v1.demo.v1", metav1.GetOptions{})
	theirs, _ := cs.CoreV1().Secrets("ns").Get(t.Context(), "sh.helm.release.v1.helm.v1", metav1.GetOptions{})
	if mine.Type != theirs.Type {
		t.Errorf("type %q, Helm writes %q", mine.Type, theirs.Type)
	}
	for k, v := range theirs.Labels {
		if k == "name" || k == "modifiedAt" {
			continue
		}
		if mine.Labels[k] != v {
			t.Errorf("label %s = %q, Helm writes %q", k, mine.Labels[k], v)
		}
	}
	if len(mine.Labels) != len(theirs.Labels) || mine.Labels["name"] != "demo" || mine.Labels["status"] != "superseded" {
		t.Errorf("labels %v, Helm writes %v", mine.Labels, theirs.Labels)
	}
	t.Logf("record of the model-orchestra chart: %d bytes (Helm's encoding: %d)", len(mine.Data["release"]), len(theirs.Data["release"]))
}
