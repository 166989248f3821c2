package preview

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/gateway"
)

// TestRenderedObjectsMatchTheirContracts renders every sample and checks
// what the chart hands to others: every built-in object decodes strictly
// (no misspelt or misplaced field), the dispatcher and gateway configuration
// files load with those binaries' own parsers, and the fetch Jobs' flags
// parse and validate with orchestra-fetch's.
func TestRenderedObjectsMatchTheirContracts(t *testing.T) {
	samples, err := filepath.Glob(filepath.Join(samplesDir, "*.yaml"))
	if err != nil || len(samples) == 0 {
		t.Fatalf("no samples (%v)", err)
	}
	strict := serializer.NewCodecFactory(scheme.Scheme, serializer.EnableStrict).UniversalDeserializer()
	p := newRenderer(t)
	for _, sample := range samples {
		t.Run(filepath.Base(sample), func(t *testing.T) {
			data, err := os.ReadFile(sample)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := decode(strings.NewReader(string(data)))
			if err != nil {
				t.Fatal(err)
			}
			res, _, err := p.Render(context.Background(), objs[0], Options{})
			if err != nil {
				t.Fatal(err)
			}
			var dispatchers, gateways, fetchJobs int
			for _, o := range res.Objects {
				if scheme.Scheme.Recognizes(o.GroupVersionKind()) {
					js, err := o.MarshalJSON()
					if err != nil {
						t.Fatal(err)
					}
					if _, _, err := strict.Decode(js, nil, nil); err != nil {
						t.Errorf("%s %s does not decode strictly: %v", o.GetKind(), o.GetName(), err)
					}
				}
				checkImages(t, o)
				switch {
				case o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-dispatcher"):
					dispatchers++
					checkDispatcherConfig(t, o)
				case o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-gateway"):
					gateways++
					checkGatewayConfig(t, o)
				case o.GetKind() == "Job":
					fetchJobs++
					checkFetchArgs(t, o)
				}
			}
			if dispatchers != 1 || gateways != 1 || fetchJobs == 0 {
				t.Errorf("rendered %d dispatcher configs, %d gateway configs and %d fetch Jobs", dispatchers, gateways, fetchJobs)
			}
		})
	}
}

func checkDispatcherConfig(t *testing.T, cm *unstructured.Unstructured) {
	t.Helper()
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "dispatcher.yaml")
	path := filepath.Join(t.TempDir(), "dispatcher.yaml")
	if err := os.WriteFile(path, []byte(raw), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := dispatch.Load(path)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Errorf("dispatcher.yaml is refused by orchestra-dispatcher: %v\n%s", err, raw)
	}
}

func checkGatewayConfig(t *testing.T, cm *unstructured.Unstructured) {
	t.Helper()
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "gateway.yaml")
	// The HMAC key file is a mounted Secret; stand in a key for it.
	var doc map[string]any
	if err := yaml.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	if auth, ok := doc["auth"].(map[string]any); ok && auth["hashKeyFile"] != nil {
		key := filepath.Join(t.TempDir(), "key")
		if err := os.WriteFile(key, []byte("0123456789abcdef0123"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth["hashKeyFile"] = key
	}
	patched, err := yaml.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := gateway.ParseConfig(patched)
	if err == nil {
		err = cfg.Queue.Validate()
	}
	if err != nil {
		t.Errorf("gateway.yaml is refused by orchestra-gateway: %v\n%s", err, raw)
	}
}

func checkFetchArgs(t *testing.T, job *unstructured.Unstructured) {
	t.Helper()
	containers, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 {
		t.Fatalf("Job %s has %d containers", job.GetName(), len(containers))
	}
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	cfg := fetch.Default()
	fs := pflag.NewFlagSet("orchestra-fetch", pflag.ContinueOnError)
	fetch.BindFlags(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		t.Errorf("Job %s: orchestra-fetch refuses its flags %v: %v", job.GetName(), args, err)
		return
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Job %s: orchestra-fetch refuses its configuration %v: %v", job.GetName(), args, err)
	}
	if cfg.ProgressConfigMap == "" || cfg.ProgressNamespace == "" {
		t.Errorf("Job %s does not report progress: %v", job.GetName(), args)
	}
}

// checkImages fails for a container without an image.
func checkImages(t *testing.T, o *unstructured.Unstructured) {
	t.Helper()
	for _, list := range []string{"containers", "initContainers"} {
		containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", list)
		for _, c := range containers {
			m := c.(map[string]any)
			if img, _ := m["image"].(string); img == "" {
				t.Errorf("%s %s: container %v has no image", o.GetKind(), o.GetName(), m["name"])
			}
		}
	}
}

// TestAnonymousGateway: without tokens the gateway needs no access to
// Secrets, and its configuration still loads.
func TestAnonymousGateway(t *testing.T) {
	p := newRenderer(t)
	objs, err := decode(strings.NewReader(minimal))
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := p.Render(context.Background(), objs[0], Options{Set: []string{"spec.gateway.auth.anonymous=true"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range res.Objects {
		switch {
		case o.GetKind() == "Role" && o.GetName() == "t-gateway":
			t.Error("an anonymous gateway still gets a Role to read Secrets")
		case o.GetKind() == "ConfigMap" && o.GetName() == "t-gateway":
			checkGatewayConfig(t, o)
		case o.GetKind() == "Deployment" && o.GetName() == "t-gateway":
			if automount, _, _ := unstructured.NestedBool(o.Object, "spec", "template", "spec", "automountServiceAccountToken"); automount {
				t.Error("an anonymous gateway still mounts a service account token")
			}
		}
	}
}
