package fetch

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
)

// recordPatches returns the progress documents patched into the ConfigMap.
func recordPatches(t *testing.T, kc *fake.Clientset) func() []Status {
	var mu sync.Mutex
	var seen []Status
	kc.PrependReactor("patch", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		p := a.(k8stesting.PatchAction)
		var body struct {
			Data map[string]string `json:"data"`
		}
		if err := json.Unmarshal(p.GetPatch(), &body); err == nil {
			mu.Lock()
			seen = append(seen, decodeStatus(t, body.Data[ProgressKey]))
			mu.Unlock()
		}
		return false, nil, nil // let the tracker apply it
	})
	return func() []Status {
		mu.Lock()
		defer mu.Unlock()
		return append([]Status(nil), seen...)
	}
}

func TestProgressConfigMap(t *testing.T) {
	fx := newRepoFixture("acme/progress").
		add("w.safetensors", safetensorsBytes(fetchtest.Random(3<<20, 31)), true).
		add("config.json", []byte(`{}`), false)
	hub := startHub(t, fx)
	hub.Faults.Throttle(15 * time.Millisecond) // make the download last several intervals

	kc := fake.NewClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "tiny-fetch-progress", Namespace: "models", Labels: map[string]string{"app": "x"}},
	})
	patches := recordPatches(t, kc)
	cfg := testConfig(t, "hf://acme/progress", hub.URL())
	cfg.ProgressConfigMap, cfg.ProgressNamespace = "tiny-fetch-progress", "models"
	cfg.Concurrency = 2

	if _, err := runFetch(t, cfg, Options{Kube: kc}); err != nil {
		t.Fatalf("Run: %v", err)
	}
	cm, err := kc.CoreV1().ConfigMaps("models").Get(context.Background(), "tiny-fetch-progress", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	final := decodeStatus(t, cm.Data[ProgressKey])
	total := totalSize(fx.files)
	if final.Phase != PhaseComplete || final.BytesDone != total || final.BytesTotal != total ||
		final.Files != 2 || final.FilesDone != 2 || !final.Verified || final.ETASeconds != 0 {
		t.Errorf("final progress = %+v, want Complete %d/%d bytes, 2/2 files, verified", final, total, total)
	}
	if _, err := time.Parse(time.RFC3339, final.UpdatedAt); err != nil {
		t.Errorf("updatedAt %q is not RFC3339", final.UpdatedAt)
	}
	if cm.Labels["app"] != "x" {
		t.Errorf("patch clobbered the ConfigMap labels: %v", cm.Labels)
	}

	all := patches()
	var sawDownloading bool
	for _, s := range all {
		if s.Phase == PhaseDownloading && s.BytesDone > 0 && s.BytesDone < total && s.BytesTotal == total {
			sawDownloading = true
		}
	}
	if !sawDownloading {
		t.Errorf("no intermediate Downloading update among %d patches: %+v", len(all), all)
	}
	for i := 1; i < len(all); i++ {
		if all[i].BytesDone < all[i-1].BytesDone && all[i].Phase == all[i-1].Phase {
			t.Errorf("bytesDone went backwards: %d then %d", all[i-1].BytesDone, all[i].BytesDone)
		}
	}
}

func TestProgressFailuresDoNotFailTheDownload(t *testing.T) {
	fx := defaultFixture()
	hub := startHub(t, fx)
	kc := fake.NewClientset() // the ConfigMap does not exist: every patch fails
	var logs bytes.Buffer
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.ProgressConfigMap, cfg.ProgressNamespace = "missing", "models"
	if _, err := runFetch(t, cfg, Options{Kube: kc, Logger: newBufLogger(&logs)}); err != nil {
		t.Fatalf("Run failed because of progress: %v", err)
	}
	assertTree(t, cfg.Dest, fx.files)
	if !strings.Contains(logs.String(), "writing progress failed") {
		t.Errorf("progress failure was not logged")
	}
}

func TestProgressReportsFailure(t *testing.T) {
	hub := startHub(t, defaultFixture())
	hub.Token = "needed"
	kc := fake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}})
	cfg := testConfig(t, "hf://acme/tiny-llm", hub.URL())
	cfg.ProgressConfigMap, cfg.ProgressNamespace = "p", "ns"
	if _, err := runFetch(t, cfg, Options{Kube: kc}); err == nil {
		t.Fatal("Run succeeded without the token")
	}
	cm, _ := kc.CoreV1().ConfigMaps("ns").Get(context.Background(), "p", metav1.GetOptions{})
	st := decodeStatus(t, cm.Data[ProgressKey])
	if st.Phase != PhaseFailed || !strings.Contains(st.Message, "access denied") {
		t.Errorf("final progress = %+v, want Failed with the reason", st)
	}
}

func TestTrackerRateAndETA(t *testing.T) {
	tr := newTracker()
	tr.setTotals(1, 1000)
	now := time.Unix(1000, 0)
	tr.snapshot(now)
	tr.add(200)
	s := tr.snapshot(now.Add(2 * time.Second))
	if s.RateBytesPerSecond != 100 || s.ETASeconds != 8 {
		t.Errorf("rate/eta = %v/%d, want 100/8", s.RateBytesPerSecond, s.ETASeconds)
	}
}

func TestBarSink(t *testing.T) {
	var b bytes.Buffer
	_ = barSink{&b}.Report(context.Background(), Status{Phase: PhaseDownloading, BytesDone: 512 << 20, BytesTotal: 1 << 30,
		RateBytesPerSecond: 100 << 20, ETASeconds: 5, Files: 3, FilesDone: 1}, false)
	for _, want := range []string{"50.0%", "512.0 MiB/1.0 GiB", "100.0 MiB/s", "ETA 5s", "files 1/3"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("bar %q lacks %q", b.String(), want)
		}
	}
}
