package preview

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/model-orchestra/operator/internal/plugin"
)

// model.convert: a safetensors source is accepted for a GGUF engine, the
// fetch Job converts it, and the engine waits for the converted file and
// loads it.
func TestConvertedModelIsFetchedConvertedAndLoaded(t *testing.T) {
	p := newRenderer(t)
	doc := `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata:
  name: t
spec:
  applications:
    chat:
      runtime:
        engine: ollama
      model:
        source: hf://org/tiny-llama
        convert:
          weightType: F16
`
	out, err := p.TemplateBytes(context.Background(), []byte(doc), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"- --format=safetensors\n",
		"- --convert=F16\n",
		"- --convert-output=model-F16.gguf\n",
		`grep -Fq '"output": "model-F16.gguf"' /models/.orchestra/convert.json`,
		"model-F16.gguf",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered stack lacks %q", want)
		}
	}
	// the default weight type, and a file the user names
	out, err = p.TemplateBytes(context.Background(), []byte(doc), Options{Set: []string{"spec.applications.chat.model.convert.weightType=null", "spec.applications.chat.model.file=tiny.gguf"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"- --convert=Q8_0\n", "- --convert-output=tiny.gguf\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered stack lacks %q", want)
		}
	}
}

func TestConvertIsRefusedWhereItCannotWork(t *testing.T) {
	p := newRenderer(t)
	for _, c := range []struct {
		name string
		set  []string
		want string
	}{
		{"pvc source", []string{"spec.applications.chat.model.source=pvc://models/llama", "spec.applications.chat.model.convert.weightType=F16"}, "a pvc:// source is read in place"},
		{"vllm", []string{"spec.applications.chat.runtime.engine=vllm", "spec.applications.chat.model.convert.weightType=F16"}, "only the llamacpp and ollama engines"},
		{"safetensors without convert", []string{"spec.applications.chat.model.format=safetensors"}, "format does not fit the engine"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := p.TemplateBytes(context.Background(), []byte(minimal), Options{Set: c.set})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

// While the fetcher's report has no verdict that the model fits, the
// engine runs no pod: its root StatefulSet renders at zero replicas (with
// a lifecycle too, which then leaves it to no leader); a refusal reaches
// the gateway, which answers the model's requests with it.
func TestSizingHoldRendersNoEnginePod(t *testing.T) {
	p := newRenderer(t)
	doc := `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata:
  name: t
  namespace: ns
spec:
  applications:
    chat:
      runtime:
        engine: ollama
        resources:
          limits:
            memory: 1Mi
      model:
        source: hf://org/tiny-llama
        convert:
          weightType: F16
    napper:
      runtime:
        engine: ollama
        resources:
          limits:
            memory: 1Mi
      model:
        source: hf://org/tiny-llama
        convert:
          weightType: F16
      lifecycle:
        minReplicas: 0
`
	objs, err := decode(strings.NewReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	refusal := `{"phase":"Failed","message":"verification failed: the model does not fit the engine's memory limit: llama F16 needs about 12.5MiB; the limit is 1.0MiB","sizing":{"architecture":"llama","context":2048,"parallel":4,"memoryBytes":13107200,"memoryLimitBytes":1048576,"marginPercent":10,"fits":false}}`
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "t-chat-model-progress", Namespace: "ns", Labels: map[string]string{
		"app.kubernetes.io/instance": "t", "app.kubernetes.io/component": "model-progress", "modelorchestra.io/application": "chat"}},
		Data: map[string]string{"progress.json": refusal}}
	ctx := plugin.WithReader(context.Background(), fake.NewClientBuilder().WithObjects(cm).Build())
	res, _, err := p.Render(ctx, objs[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	var dispatcherConfig, gatewayConfig string
	roots := map[string]bool{}
	for _, o := range res.Objects {
		switch {
		case o.GetKind() == "StatefulSet" && (o.GetName() == "t-chat" || o.GetName() == "t-napper"):
			n, found, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "replicas")
			roots[o.GetName()] = found && n == float64(0)
		case o.GetKind() == "ConfigMap" && o.GetName() == "t-dispatcher":
			dispatcherConfig, _, _ = unstructured.NestedString(o.Object, "data", "dispatcher.yaml")
		case o.GetKind() == "ConfigMap" && o.GetName() == "t-gateway":
			gatewayConfig, _, _ = unstructured.NestedString(o.Object, "data", "gateway.yaml")
		}
	}
	if !roots["t-chat"] || !roots["t-napper"] {
		t.Errorf("root StatefulSets at zero replicas: %v; want both (refused, and not sized yet)", roots)
	}
	if !strings.Contains(gatewayConfig, `unavailable: "the model does not fit the engine's memory limit: llama F16 needs about 12.5MiB; the limit is 1.0MiB"`) {
		t.Errorf("the gateway's config does not carry the refusal:\n%s", gatewayConfig)
	}
	if strings.Contains(dispatcherConfig, `rootStatefulSet: "t-napper"`) {
		t.Errorf("the lifecycle leader is given the held application:\n%s", dispatcherConfig)
	}
}
