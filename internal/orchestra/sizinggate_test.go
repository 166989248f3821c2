package orchestra

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/plugin"
)

// sizedApp is an Ollama application with a GGUF file, 4 sequences of
// 2048 tokens; limit is its engine's memory limit ("" none).
func sizedApp(t *testing.T, limit string, edit func(*v1alpha1.Application)) v1alpha1.Application {
	t.Helper()
	spec := `{applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}, runtime: {engine: ollama` +
		map[bool]string{true: `, resources: {limits: {memory: "` + limit + `"}}`, false: ""}[limit != ""] +
		`}, serving: {maxConcurrency: 4, contextLength: 2048}}}}`
	mo, err := Decode(owner(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	app := mo.Spec.Applications["chat"]
	if edit != nil {
		edit(&app)
	}
	return app
}

// report is the fetcher's progress with a verdict for 2048 × 4 tokens
// against limit bytes with the default 10 % margin.
func report(limit int64, fits bool, edit func(*v1alpha1.ModelSize)) *fetchProgress {
	sz := &v1alpha1.ModelSize{Architecture: "llama", Parameters: 1_100_000_000, WeightType: "Q8_0", FileBytes: 1_170_000_000,
		Context: 2048, Parallel: 4, MemoryBytes: 1_500_000_000, MemoryLimitBytes: limit, MarginPercent: 10, Fits: fits}
	if edit != nil {
		edit(sz)
	}
	p := &fetchProgress{Phase: "Complete", Sizing: sz}
	if !fits {
		p.Phase, p.Message = "Failed", "verification failed: the model does not fit the engine's memory limit: llama Q8_0 needs about 1.4GiB; the limit is 1.0GiB"
	}
	return p
}

func TestDecideSizingGate(t *testing.T) {
	const gi = int64(1 << 30)
	for _, tc := range []struct {
		name string
		app  v1alpha1.Application
		p    *fetchProgress
		want sizingGate
	}{
		{"no limit: nothing to wait for", sizedApp(t, "", nil), nil, sizingGate{}},
		{"no report yet: held", sizedApp(t, "2Gi", nil), nil, sizingGate{Hold: true}},
		{"downloading, no verdict: held", sizedApp(t, "2Gi", nil), &fetchProgress{Phase: "Downloading"}, sizingGate{Hold: true}},
		{"fits", sizedApp(t, "2Gi", nil), report(2*gi, true, nil), sizingGate{}},
		{"refused: held with the numbers", sizedApp(t, "1Gi", nil), report(gi, false, nil),
			sizingGate{Hold: true, Refused: "the model does not fit the engine's memory limit: llama Q8_0 needs about 1.4GiB; the limit is 1.0GiB"}},
		{"a verdict for another limit (the previous Job's): held", sizedApp(t, "1Gi", nil), report(2*gi, true, nil), sizingGate{Hold: true}},
		{"a verdict for another concurrency: held", sizedApp(t, "2Gi", func(a *v1alpha1.Application) { a.Serving.MaxConcurrency = 8 }), report(2*gi, true, nil), sizingGate{Hold: true}},
		{"a verdict for another margin: held", sizedApp(t, "2Gi", func(a *v1alpha1.Application) { a.Model.Sizing = &v1alpha1.ModelSizing{MarginPercent: 50} }), report(2*gi, true, nil), sizingGate{Hold: true}},
		{"the override: never held", sizedApp(t, "1Gi", func(a *v1alpha1.Application) {
			a.Model.Sizing = &v1alpha1.ModelSizing{MarginPercent: 10, IgnoreMemoryLimit: true}
		}), nil, sizingGate{}},
		{"the model's own context when none is configured", sizedApp(t, "2Gi", func(a *v1alpha1.Application) { a.Serving.ContextLength = 0 }),
			report(2*gi, true, func(s *v1alpha1.ModelSize) { s.Context = 4096 }), sizingGate{}},
		{"a known GPU product without a memory limit: held until sized", sizedApp(t, "", func(a *v1alpha1.Application) { a.Runtime.GPU = v1alpha1.GPUSpec{Count: 1, Product: "NVIDIA-L4"} }), nil, sizingGate{Hold: true}},
		{"a known GPU product: fits", sizedApp(t, "", func(a *v1alpha1.Application) { a.Runtime.GPU = v1alpha1.GPUSpec{Count: 1, Product: "NVIDIA-L4"} }),
			report(0, true, func(s *v1alpha1.ModelSize) { s.GPUs, s.GPUProduct, s.GPUProductMemoryBytes = 1, "NVIDIA-L4", 23034<<20 }), sizingGate{}},
		{"an unknown GPU product without a memory limit: not checked", sizedApp(t, "", func(a *v1alpha1.Application) { a.Runtime.GPU = v1alpha1.GPUSpec{Count: 1, Product: "Acme-X1"} }), nil, sizingGate{}},
		{"the simulator: not sized", func() v1alpha1.Application {
			mo, err := Decode(owner(t, `{applications: {chat: {runtime: {engine: simulator, resources: {limits: {memory: 1Mi}}}}}}`))
			if err != nil {
				t.Fatal(err)
			}
			return mo.Spec.Applications["chat"]
		}(), nil, sizingGate{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, decideSizingGate(tc.app, tc.p)); diff != "" {
				t.Errorf("gate (-want +got):\n%s", diff)
			}
		})
	}
}

// The translator reads the fetcher's report from the cluster: until it
// says the model fits, the application's values carry engineHold (the
// chart renders its StatefulSets at zero replicas and leaves it out of the
// lifecycle leader's applications); a refusal carries its reason for the
// gateway.
func TestTranslatorHoldsTheEngineUntilTheModelFits(t *testing.T) {
	obj := owner(t, `{applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}, runtime: {engine: ollama, resources: {limits: {memory: 1Gi}}}, serving: {maxConcurrency: 4, contextLength: 2048}},
		free: {model: {source: "hf://org/repo", file: m.gguf}, runtime: {engine: ollama}}}}`)
	progressCM := func(p *fetchProgress) *corev1.ConfigMap {
		b, _ := json.Marshal(p)
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "demo-chat-model-progress", Namespace: "ns", Labels: map[string]string{
			"app.kubernetes.io/instance": "demo", labelComponent: "model-progress", labelApplication: "chat"}},
			Data: map[string]string{progressKey: string(b)}}
	}
	hold := func(t *testing.T, objs ...*corev1.ConfigMap) (any, any) {
		t.Helper()
		b := fake.NewClientBuilder()
		for _, o := range objs {
			b = b.WithObjects(o)
		}
		vals, err := Translator{Getenv: func(string) string { return "" }}.Translate(plugin.WithReader(context.Background(), b.Build()), obj)
		if err != nil {
			t.Fatal(err)
		}
		apps := vals["global"].(map[string]any)["applications"].(map[string]any)
		return apps["chat"].(map[string]any)["engineHold"], apps["free"].(map[string]any)["engineHold"]
	}
	if chat, free := hold(t); chat == nil || free != nil {
		t.Errorf("before any report: chat hold %v, free hold %v; want chat held, free (no limit) not", chat, free)
	}
	if chat, _ := hold(t, progressCM(report(1<<30, true, nil))); chat != nil {
		t.Errorf("fits: hold %v", chat)
	}
	chat, _ := hold(t, progressCM(report(1<<30, false, nil)))
	if r, _ := chat.(map[string]any)["refused"].(string); !strings.Contains(r, "the limit is 1.0GiB") {
		t.Errorf("refused: hold %v", chat)
	}
	// the offline preview has no cluster: nothing is held
	vals, err := Translator{}.Translate(plugin.WithReader(context.Background(), PolicyDocuments{}), obj)
	if err != nil {
		t.Fatal(err)
	}
	if h := vals["global"].(map[string]any)["applications"].(map[string]any)["chat"].(map[string]any)["engineHold"]; h != nil {
		t.Errorf("offline: hold %v", h)
	}
}
