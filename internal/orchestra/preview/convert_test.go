package preview

import (
	"context"
	"strings"
	"testing"
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
