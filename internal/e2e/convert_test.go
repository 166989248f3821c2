package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/convert"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/modelsize"
)

// TestConvert serves the mirror's Hugging Face checkpoint (safetensors and
// a tokenizer, hf://demo/tiny-llama-hf) through the real Ollama engine on
// real pods, as config/samples/ollama-safetensors.yaml does: the fetch Job
// converts it to GGUF in the cache and sizes it, and the root loads the
// converted file. A second orchestra whose memory limit is far below the
// estimate is refused with the numbers: no engine pod ever exists for it,
// and its gateway answers the model's requests with the refusal.
func TestConvert(t *testing.T) {
	requireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-convert")
	token := apiToken(ctx, t, ns)
	const fits, tooLarge = "tiny-hf", "too-large"
	// Every root pod the refused orchestra ever gets, watched from before
	// it is created: a pod deleted again soon would still be seen.
	refusedPods := watchRootPods(ctx, t, ns, tooLarge)
	// The refused one first: its fetch Job runs while the other's stack
	// comes up.
	if _, err := stack.Apply(ctx, env.dyn, convertResource(t, ns, tooLarge, "1Mi", "1Mi")); err != nil {
		t.Fatal(err)
	}
	if _, err := stack.Apply(ctx, env.dyn, convertResource(t, ns, fits, "256Mi", "1Gi")); err != nil {
		t.Fatal(err)
	}

	t.Run("the safetensors checkpoint is converted and served by Ollama", func(t *testing.T) {
		mo := waitReady(ctx, t, ns, fits)
		out := convert.OutputName(convert.Type(v1alpha1.ConvertF16))
		m := mo.Status.Applications[convertApp].Model
		t.Logf("model status: phase %s, message %q, size %+v", m.Phase, m.Message, m.Size)
		if m.Phase != "Complete" || !m.Verified {
			t.Errorf("model phase %q verified %v; want Complete and verified", m.Phase, m.Verified)
		}
		if !strings.Contains(m.Message, out) {
			t.Errorf("model message %q does not name the converted file %s", m.Message, out)
		}
		gguf, manifest := cachedConversion(ctx, t, ns, fits, out)
		if manifest.Output != out || !manifest.Complete || manifest.Type != convert.Type(v1alpha1.ConvertF16) || manifest.Size != gguf || manifest.SHA256 == "" {
			t.Errorf("%s = %+v; want complete, F16, output %s of its %d bytes with a digest", filepath.Join(".orchestra", "convert.json"), manifest, out, gguf)
		}
		if sz := m.Size; sz == nil {
			t.Error("status has no model size")
		} else if sz.Architecture != "llama" || sz.WeightType != "F16" || sz.Parameters <= 0 || sz.FileBytes != gguf ||
			sz.Context != convertContext || sz.Parallel != 2 || sz.MemoryBytes <= sz.FileBytes/2 || !sz.Fits || sz.MemoryLimitBytes != 1<<30 {
			t.Errorf("status model size %+v; want llama F16 of the GGUF's %d bytes, its estimate for %d tokens × 2 sequences under the 1GiB limit", *sz, gguf, convertContext)
		}
		if c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionModelReady); c == nil || c.Status != metav1.ConditionTrue {
			t.Errorf("ModelReady %+v; want True", c)
		}
		// The engine waited for the verdict without a pod: its root pod
		// was created after the fetcher's last report (the verdict, which
		// it writes before it exits, so before the Job completes); how
		// much later is what the wait costs a model that fits.
		if verdict, done, created, err := verdictAndRootCreated(ctx, ns, fits); err != nil {
			t.Error(err)
		} else {
			t.Logf("the root pod was created %.0fs after the fetcher's verdict (%.0fs after its Job completed)", created.Sub(verdict).Seconds(), created.Sub(done).Seconds())
			if created.Before(verdict.Truncate(time.Second)) {
				t.Errorf("the root pod was created at %s, before the fetcher's verdict at %s", created, verdict)
			}
		}

		base, err := stack.GatewayURL(ctx, env.cs, ns, fits)
		if err != nil {
			t.Fatal(err)
		}
		// Ready means the gateway has ready endpoints; kube-proxy may
		// program the NodePort a moment later.
		addr := strings.TrimPrefix(strings.TrimSuffix(base, "/v1"), "http://")
		eventually(t, 30*time.Second, func() error {
			if !dialable(addr) {
				return fmt.Errorf("the gateway's NodePort %s accepts no connection", addr)
			}
			return nil
		})
		res, err := rawStream(ctx, base, token, "/chat/completions", map[string]any{
			"model": convertServed, "stream": true, "max_tokens": 8, "stream_options": map[string]any{"include_usage": true},
			"messages": []map[string]string{{"role": "user", "content": chatPrompt}},
		})
		if err != nil {
			t.Fatalf("chat through the gateway: %v", err)
		}
		content, usage := res.Content, res.Usage
		t.Logf("Ollama answered %q, usage %+v", content, usage)
		if content == "" || usage == nil || usage.PromptTokens == 0 || usage.CompletionTokens == 0 || usage.CompletionTokens > 8 {
			t.Errorf("chat through the gateway: content %q, usage %+v; want non-empty content, prompt and 1..8 completion tokens", content, usage)
		}
	})

	t.Run("a model too large for its memory limit is refused before the engine starts", func(t *testing.T) {
		var mo *v1alpha1.ModelOrchestra
		eventually(t, 4*time.Minute, func() error {
			var err error
			if mo, err = stack.Get(ctx, env.dyn, ns, tooLarge); err != nil {
				return err
			}
			c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionModelReady)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonModelTooLarge {
				return fmt.Errorf("ModelReady %+v; want False %s", c, v1alpha1.ReasonModelTooLarge)
			}
			return nil
		})
		c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionModelReady)
		sz := mo.Status.Applications[convertApp].Model.Size
		t.Logf("ModelReady: %s: %s", c.Reason, c.Message)
		if sz == nil || sz.Fits || sz.MemoryLimitBytes != 1<<20 || sz.MemoryBytes == 0 {
			t.Fatalf("status model size %+v; want the estimate, the 1MiB limit and fits false", sz)
		}
		for _, want := range []string{modelsize.Bytes(sz.MemoryBytes), "the limit is " + modelsize.Bytes(sz.MemoryLimitBytes), "F16"} {
			if !strings.Contains(c.Message, want) {
				t.Errorf("ModelReady message %q does not say %q", c.Message, want)
			}
		}
		if app := mo.Status.Applications[convertApp]; app.Phase != v1alpha1.PhaseFailed || !strings.Contains(app.Message, "no engine pod is started") {
			t.Errorf("application phase %s %q; want Failed saying no engine pod is started", app.Phase, app.Message)
		}
		// The refusal is final at once: the fetch Job failed by its
		// podFailurePolicy on exit code 3, with one pod, no retries.
		jobs, err := env.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + tooLarge + ",app.kubernetes.io/component=model-fetch"})
		if err != nil || len(jobs.Items) != 1 {
			t.Fatalf("fetch Jobs of %s: %v %d", tooLarge, err, len(jobs.Items))
		}
		job := jobs.Items[0]
		failedBy := ""
		for _, c := range job.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				failedBy = c.Reason
			}
		}
		if failedBy != batchv1.JobReasonPodFailurePolicy || job.Status.Failed != 1 {
			t.Errorf("fetch Job %s: failed by %q after %d failed pods; want %s after 1", job.Name, failedBy, job.Status.Failed, batchv1.JobReasonPodFailurePolicy)
		}
		// The root StatefulSet is held at zero replicas, and no root pod
		// ever existed: from before the resource was created until 30 s
		// after the verdict.
		sts, err := env.cs.AppsV1().StatefulSets(ns).Get(ctx, tooLarge+"-"+convertApp, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 0 {
			t.Errorf("root StatefulSet %s replicas %v; want 0", sts.Name, sts.Spec.Replicas)
		}
		// A request for the refused model is answered at once with the
		// refusal, in OpenAI's error format.
		base, err := stack.GatewayURL(ctx, env.cs, ns, tooLarge)
		if err != nil {
			t.Fatal(err)
		}
		addr := strings.TrimPrefix(strings.TrimSuffix(base, "/v1"), "http://")
		var status int
		var body string
		eventually(t, 90*time.Second, func() error {
			if !dialable(addr) {
				return fmt.Errorf("the gateway's NodePort %s accepts no connection", addr)
			}
			var err error
			status, body, err = tryPostJSON(ctx, base, token, "/chat/completions", map[string]any{
				"model": convertServed, "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": chatPrompt}},
			})
			if err != nil {
				// the gateway of the config from before the verdict may be
				// on its way out
				return fmt.Errorf("POST /chat/completions: %w", err)
			}
			if status != http.StatusServiceUnavailable || !strings.Contains(body, "does not fit") {
				// the gateway may still run the config from before the verdict
				return fmt.Errorf("status %d %s; want 503 naming the refusal", status, body)
			}
			return nil
		})
		t.Logf("the gateway answers the refused model: %d %s", status, body)
		if !strings.Contains(body, `"code":"model_not_served"`) || !strings.Contains(body, "the limit is "+modelsize.Bytes(sz.MemoryLimitBytes)) {
			t.Errorf("gateway answer %s; want model_not_served naming the limit", body)
		}
		time.Sleep(30 * time.Second)
		if seen := refusedPods(); len(seen) > 0 {
			t.Errorf("root pods of the refused application existed: %v", seen)
		}
	})
}

// watchRootPods watches the root pods of orchestra name from now on; the
// function it returns lists every one seen so far.
func watchRootPods(ctx context.Context, t *testing.T, ns, name string) func() []string {
	t.Helper()
	sel := "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + convertApp + ",app.kubernetes.io/component=root"
	w, err := env.cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	var mu sync.Mutex
	seen := map[string]bool{}
	go func() {
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				mu.Lock()
				seen[p.Name] = true
				mu.Unlock()
			}
		}
	}()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		var out []string
		for n := range seen {
			out = append(out, n)
		}
		return out
	}
}

// verdictAndRootCreated is when orchestra name's fetcher wrote its last
// progress report, when its fetch Job completed and when its first root
// pod was created.
func verdictAndRootCreated(ctx context.Context, ns, name string) (verdict, done, created time.Time, err error) {
	cms, err := env.cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=model-progress"})
	if err != nil {
		return verdict, done, created, err
	}
	for _, cm := range cms.Items {
		var p struct {
			UpdatedAt time.Time `json:"updatedAt"`
		}
		if json.Unmarshal([]byte(cm.Data["progress.json"]), &p) == nil {
			verdict = p.UpdatedAt
		}
	}
	jobs, err := env.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=model-fetch"})
	if err != nil {
		return verdict, done, created, err
	}
	for _, j := range jobs.Items {
		if j.Status.CompletionTime != nil {
			done = j.Status.CompletionTime.Time
		}
	}
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=root"})
	if err != nil {
		return verdict, done, created, err
	}
	for _, p := range pods.Items {
		if c := p.CreationTimestamp.Time; created.IsZero() || c.Before(created) {
			created = c
		}
	}
	if verdict.IsZero() || done.IsZero() || created.IsZero() {
		return verdict, done, created, fmt.Errorf("the fetcher's last report at %v, its Job completed at %v, the root pod created at %v", verdict, done, created)
	}
	return verdict, done, created, nil
}

const (
	convertApp     = "tiny"
	convertServed  = "tiny"
	convertContext = 256
)

// convertResource is config/samples/ollama-safetensors.yaml with the
// e2e mirror, the built Ollama image and the given engine memory request
// and limit.
func convertResource(t *testing.T, ns, name, memoryRequest, memoryLimit string) *unstructured.Unstructured {
	t.Helper()
	image, err := stack.ImageRef(filepath.Join(env.root, "_output", "images", "ollama.tar"))
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       v1alpha1.Kind,
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"gateway": map[string]any{
				"replicas": int64(1),
				"service":  map[string]any{"type": "NodePort"},
			},
			"applications": map[string]any{
				convertApp: map[string]any{
					"model": map[string]any{
						"source":      "hf://" + stack.DemoHFModel,
						"hubEndpoint": env.hub,
						"format":      "safetensors",
						"convert":     map[string]any{"weightType": string(v1alpha1.ConvertF16)},
						"sizing":      map[string]any{"marginPercent": int64(20)},
						"cache":       map[string]any{"size": "1Gi"},
					},
					"runtime": map[string]any{
						"engine": "ollama",
						"image":  image,
						"resources": map[string]any{
							"requests": map[string]any{"cpu": "100m", "memory": memoryRequest},
							"limits":   map[string]any{"memory": memoryLimit},
						},
					},
					"serving": map[string]any{"servedModelName": convertServed, "maxConcurrency": int64(2), "contextLength": int64(convertContext)},
				},
			},
		},
	}}
}

// cachedConversion reads the size of the converted file out and
// .orchestra/convert.json from the cache claim of orchestra name, in its directory on this machine (the real node; the
// local cluster's provisioner backs claims with host directories).
func cachedConversion(ctx context.Context, t *testing.T, ns, name, out string) (int64, convert.Manifest) {
	t.Helper()
	pvcs, err := env.cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pvc := range pvcs.Items {
		if !strings.HasPrefix(pvc.Name, name+"-") || pvc.Spec.VolumeName == "" {
			continue
		}
		pv, err := env.cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.HostPath == nil {
			continue
		}
		b, err := os.ReadFile(convert.ManifestPath(pv.Spec.HostPath.Path))
		if err != nil {
			continue
		}
		var m convert.Manifest
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s of claim %s: %v", convert.ManifestPath(pv.Spec.HostPath.Path), pvc.Name, err)
		}
		fi, err := os.Stat(filepath.Join(pv.Spec.HostPath.Path, out))
		if err != nil {
			t.Fatalf("the converted file of claim %s: %v", pvc.Name, err)
		}
		return fi.Size(), m
	}
	t.Fatalf("no cache claim of %s/%s holds .orchestra/convert.json", ns, name)
	return 0, convert.Manifest{}
}
