package preview

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
	"github.com/model-orchestra/operator/internal/plugin"
)

var update = flag.Bool("update", false, "rewrite the golden files from the current output")

const samplesDir = "../../../config/samples"

func newRenderer(t *testing.T) *Renderer {
	t.Helper()
	p, err := New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return p
}

// TestSamplesGolden renders every sample in config/samples and compares
// the result with testdata/<sample>.golden.yaml.
func TestSamplesGolden(t *testing.T) {
	samples, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples in %s (%v)", samplesDir, err)
	}
	p := newRenderer(t)
	for _, sample := range samples {
		name := strings.TrimSuffix(filepath.Base(sample), ".yaml")
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(sample)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.TemplateBytes(context.Background(), data, Options{})
			if err != nil {
				t.Fatalf("template: %v", err)
			}
			golden := filepath.Join("testdata", name+".golden.yaml")
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if diff := cmp.Diff(string(want), got); diff != "" {
				t.Errorf("rendered %s differs from %s (-want +got; go test -update refreshes):\n%s", sample, golden, diff)
			}
		})
	}
}

// TestTemplateIsDeterministic renders the same resource twice: the operator
// relies on identical output to skip needless upgrades.
func TestTemplateIsDeterministic(t *testing.T) {
	p := newRenderer(t)
	data, err := os.ReadFile(filepath.Join(samplesDir, "vllm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	first, err := p.TemplateBytes(context.Background(), data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		again, err := p.TemplateBytes(context.Background(), data, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if again != first {
			t.Fatalf("two renders of the same resource differ:\n%s", cmp.Diff(first, again))
		}
	}
}

const minimal = `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata:
  name: t
spec:
  applications:
    chat:
      model:
        source: hf://org/repo
        file: m.gguf
`

func TestSetChangesTheResource(t *testing.T) {
	p := newRenderer(t)
	got, err := p.TemplateBytes(context.Background(), []byte(minimal), Options{
		Set:       []string{"spec.applications.chat.scaling.replicas=3", "spec.gateway.replicas=4"},
		Namespace: "team-a",
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name: t-chat\n  namespace: team-a", "replicas: 3", "replicas: 4"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q", want)
		}
	}
}

// TestInvalidResources checks that what the API server would refuse is
// refused offline too, with a message naming the field.
func TestInvalidResources(t *testing.T) {
	p := newRenderer(t)
	cases := []struct {
		name string
		set  []string
		doc  string
		want []string
	}{
		{
			name: "dllama workers not a power of two",
			set:  []string{"spec.applications.chat.runtime.engine=dllama", "spec.applications.chat.runtime.workers=2", "spec.applications.chat.model.tokenizerFile=t.t", "spec.applications.chat.model.format=dllama"},
			want: []string{"spec.applications[chat].runtime.workers", "power of two"},
		},
		{
			name: "gpu product without count",
			set:  []string{"spec.applications.chat.runtime.gpu.product=NVIDIA-A100"},
			want: []string{"spec.applications[chat].runtime.gpu.count", "product needs count"},
		},
		{
			name: "pvc source with a cache",
			set:  []string{"spec.applications.chat.model.source=pvc://models/llama", "spec.applications.chat.model.cache.size=5Gi"},
			want: []string{"spec.applications[chat].model.cache", "pvc:// source"},
		},
		{
			name: "unknown source scheme",
			set:  []string{"spec.applications.chat.model.source=ftp://x/y"},
			want: []string{"spec.applications[chat].model.source", "source must be hf://"},
		},
		{
			name: "unknown engine",
			set:  []string{"spec.applications.chat.runtime.engine=tgi"},
			want: []string{"spec.applications.chat.runtime.engine", `Unsupported value: "tgi"`},
		},
		{
			name: "format does not fit the engine",
			set:  []string{"spec.applications.chat.model.format=safetensors"},
			want: []string{"spec.applications[chat].model.format", "format does not fit the engine"},
		},
		{
			name: "gguf engine with an empty file",
			set:  []string{"spec.applications.chat.model.file="},
			want: []string{"spec.applications.chat.model.file", "should be at least 1 chars long"},
		},
		{
			name: "gguf engine without file",
			set:  []string{"spec.applications.chat.model.file=null"},
			want: []string{"spec.applications[chat].model.file", "file is required"},
		},
		{
			name: "multi-node vllm on a ReadWriteOnce cache",
			set:  []string{"spec.applications.chat.runtime.engine=vllm", "spec.applications.chat.runtime.workers=1", "spec.applications.chat.model.file=null"},
			want: []string{"spec.applications[chat].model.cache", "ReadWriteMany"},
		},
		{
			name: "workers on a single-node engine",
			set:  []string{"spec.applications.chat.runtime.engine=ollama", "spec.applications.chat.runtime.workers=1"},
			want: []string{"spec.applications[chat].runtime.workers", "workers are supported by"},
		},
		{
			name: "nats replicas not 1, 3 or 5",
			set:  []string{"spec.nats.replicas=2"},
			want: []string{"spec.nats.replicas", "Unsupported value: 2"},
		},
		{
			name: "nats url with a foreign scheme",
			set:  []string{`spec.nats.url=nats://a:4222\,http://b`},
			want: []string{"spec.nats.url", "comma-separated nats://"},
		},
		{
			name: "credentials for the in-cluster nats",
			set:  []string{"spec.nats.credentialsSecretRef.name=creds"},
			want: []string{"spec.nats.credentialsSecretRef", "external url"},
		},
		{
			name: "bad application name",
			doc:  strings.Replace(minimal, "    chat:", "    Chat_Bot:", 1),
			want: []string{"spec.applications", "DNS labels"},
		},
		{
			name: "unknown field",
			set:  []string{"spec.applications.chat.runtime.gpus=1"},
			want: []string{"spec.applications.chat.runtime.gpus", "unknown field"},
		},
		{
			name: "name too long",
			set:  []string{"metadata.name=a-name-that-is-much-longer-than-forty-characters"},
			want: []string{"metadata.name must be at most 40"},
		},
		{
			name: "name that cannot name a Service",
			set:  []string{"metadata.name=1st.stack"},
			want: []string{"metadata.name must be a DNS label"},
		},
		{
			name: "nodePort on a ClusterIP service",
			set:  []string{"spec.gateway.service.nodePort=30080"},
			want: []string{"spec.gateway.service.nodePort", "nodePort needs type"},
		},
		{
			name: "nats storage too small for the streams",
			set:  []string{"spec.nats.storage.size=1Gi"},
			want: []string{"spec.nats.storage.size", "must be at least 2Gi"},
		},
		{
			name: "hub endpoint with an https source",
			set:  []string{"spec.applications.chat.model.source=https://example.com/m.gguf", "spec.applications.chat.model.hubEndpoint=http://mirror:8080"},
			want: []string{"spec.applications[chat].model.hubEndpoint", "only used with hf:// sources"},
		},
		{
			name: "hub endpoint that is not an http URL",
			set:  []string{"spec.applications.chat.model.hubEndpoint=ftp://mirror"},
			want: []string{"spec.applications.chat.model.hubEndpoint", "should match"},
		},
		{
			name: "hub endpoint with a query",
			set:  []string{"spec.applications.chat.model.hubEndpoint=http://mirror:8080/?x=1"},
			want: []string{"spec.applications[chat].model.hubEndpoint", "query"},
		},
		{
			name: "no applications",
			doc:  "apiVersion: modelorchestra.io/v1alpha1\nkind: ModelOrchestra\nmetadata: {name: t}\nspec: {applications: {}}\n",
			want: []string{"spec.applications", "should have at least 1 properties"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			doc := tc.doc
			if doc == "" {
				doc = minimal
			}
			_, err := p.TemplateBytes(context.Background(), []byte(doc), Options{Set: tc.set})
			if err == nil {
				t.Fatal("rendered an invalid resource")
			}
			if !errors.Is(err, validation.ErrInvalid) {
				t.Errorf("error %v does not wrap validation.ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not mention %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestHubEndpointReachesTheFetchJob checks that model.hubEndpoint is the
// fetcher's --hf-endpoint and that a changed hub makes a new fetch Job
// (Job templates are immutable).
func TestHubEndpointReachesTheFetchJob(t *testing.T) {
	p := newRenderer(t)
	render := func(set ...string) string {
		t.Helper()
		out, err := p.TemplateBytes(context.Background(), []byte(minimal), Options{Set: set})
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	jobName := func(manifest string) string {
		t.Helper()
		for _, doc := range strings.Split(manifest, "\n---") {
			if strings.Contains(doc, "kind: Job\n") {
				for _, line := range strings.Split(doc, "\n") {
					if strings.HasPrefix(line, "  name: ") {
						return strings.TrimPrefix(line, "  name: ")
					}
				}
			}
		}
		t.Fatal("no Job rendered")
		return ""
	}
	plain := render()
	if strings.Contains(plain, "--hf-endpoint") {
		t.Error("a resource without hubEndpoint renders --hf-endpoint")
	}
	mirror := render("spec.applications.chat.model.hubEndpoint=http://10.0.0.1:8088")
	if !strings.Contains(mirror, "- --hf-endpoint=http://10.0.0.1:8088\n") {
		t.Error("the fetch Job lacks --hf-endpoint=http://10.0.0.1:8088")
	}
	other := render("spec.applications.chat.model.hubEndpoint=https://hf-mirror.example.com")
	if a, b, c := jobName(plain), jobName(mirror), jobName(other); a == b || b == c || a == c {
		t.Errorf("fetch Job names %s, %s, %s: want a new Job for each hub", a, b, c)
	}
	if a, b := jobName(plain), jobName(render("spec.applications.chat.runtime.nodeSelector.disk=ssd")); a == b {
		t.Errorf("fetch Job name %s unchanged by a new nodeSelector: the upgrade would fail on the immutable Job template", a)
	}
}

func TestNoResource(t *testing.T) {
	p := newRenderer(t)
	if _, err := p.TemplateBytes(context.Background(), []byte("---\n# nothing\n"), Options{}); !errors.Is(err, ErrNoResource) {
		t.Fatalf("got %v, want ErrNoResource", err)
	}
}

// TestPoliciesBesideTheResource: CheckpointPolicies in the input are
// validated against their CRD and served to the values translator; they
// render nothing themselves.
func TestPoliciesBesideTheResource(t *testing.T) {
	p := newRenderer(t)
	const mo = `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: demo}
spec:
  applications:
    chat:
      model: {source: "hf://org/repo", file: m.gguf}
      lifecycle: {minReplicas: 1, checkpointPolicy: fast}
`
	policy := func(spec string) string {
		return "apiVersion: modelorchestra.io/v1alpha1\nkind: CheckpointPolicy\nmetadata: {name: fast}\nspec: " + spec + "\n---\n"
	}
	all, err := decode(strings.NewReader(policy("{slo: {resumeRamSeconds: 2}}") + mo))
	if err != nil {
		t.Fatal(err)
	}
	objs, ctx, err := p.split(context.Background(), all, Options{Namespace: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].GetKind() != "ModelOrchestra" {
		t.Fatalf("to render: %v, want the ModelOrchestra only", objs)
	}
	got := &unstructured.Unstructured{}
	got.SetGroupVersionKind(orchestra.CheckpointPolicyGVK)
	if err := plugin.ReaderFrom(ctx).Get(ctx, client.ObjectKey{Namespace: "ns", Name: "fast"}, got); err != nil {
		t.Fatalf("the translator cannot read the policy beside the resource: %v", err)
	}
	if v, _, _ := unstructured.NestedInt64(got.Object, "spec", "slo", "resumeRamSeconds"); v != 2 {
		t.Errorf("served policy %v", got.Object)
	}
	if _, err := p.TemplateBytes(context.Background(), []byte(policy("{slo: {resumeRamSeconds: 2}}")+mo), Options{}); err != nil {
		t.Errorf("template with a policy: %v", err)
	}

	_, err = p.TemplateBytes(context.Background(), []byte(policy("{triggers: {intervalSeconds: 5}}")+mo), Options{})
	if !errors.Is(err, validation.ErrInvalid) || !strings.Contains(err.Error(), "spec.triggers.intervalSeconds") {
		t.Errorf("an invalid policy: error %v, want it refused naming spec.triggers.intervalSeconds", err)
	}
	_, err = p.TemplateBytes(context.Background(), []byte(policy("{}")), Options{})
	if !errors.Is(err, ErrNoResource) {
		t.Errorf("a policy alone: error %v, want ErrNoResource", err)
	}
}
