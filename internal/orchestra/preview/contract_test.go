package preview

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/render"
)

// renderSample renders the one ModelOrchestra of a sample file, with the
// CheckpointPolicies beside it, as Template does.
func renderSample(t *testing.T, p *Renderer, path string) *render.Result {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	all, err := decode(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	objs, ctx, err := p.split(context.Background(), all, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 {
		t.Fatalf("%s holds %d resources to render, want 1", path, len(objs))
	}
	res, _, err := p.Render(ctx, objs[0], Options{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

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
			res := renderSample(t, p, sample)
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

// TestEveryNATSClientUsesOneServer: the gateway and dispatcher configuration
// files and the environment and volumes of every NATS client pod name the
// same server, stream replica count and credentials, those the resource
// asks for; the in-cluster URL names the client Service the nats part
// renders.
func TestEveryNATSClientUsesOneServer(t *testing.T) {
	p := newRenderer(t)
	for _, tc := range []struct {
		name, url, creds, replicas string
		set                        []string
	}{
		{name: "in-cluster", url: "nats://t-nats.ns.svc:4222", replicas: "3", set: []string{"spec.nats.replicas=3"}},
		{name: "external with credentials", url: "tls://a:4222,tls://b:4222", creds: "nats-creds", replicas: "1",
			set: []string{`spec.nats.url=tls://a:4222\,tls://b:4222`, "spec.nats.credentialsSecretRef.name=nats-creds"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := decode(strings.NewReader(minimal))
			if err != nil {
				t.Fatal(err)
			}
			res, _, err := p.Render(context.Background(), objs[0], Options{Set: tc.set, Namespace: "ns"})
			if err != nil {
				t.Fatal(err)
			}
			credsDir, credsFile := "", ""
			if tc.creds != "" {
				credsDir, credsFile = "/etc/orchestra/nats", "/etc/orchestra/nats/creds"
			}
			seen := map[string]bool{}
			clients := 0
			for _, o := range res.Objects {
				check := func(what, got, want string) {
					t.Helper()
					if got != want {
						t.Errorf("%s %s: %s is %q, want %q", o.GetKind(), o.GetName(), what, got, want)
					}
				}
				seen[o.GetKind()+"/"+o.GetName()] = true
				switch {
				case o.GetKind() == "Service" && o.GetName() == "t-nats":
					ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
					if len(ports) == 0 || fmt.Sprint(ports[0].(map[string]any)["port"]) != "4222" {
						t.Errorf("Service t-nats serves %v, want port 4222", ports)
					}
				case o.GetKind() == "ConfigMap" && o.GetName() == "t-dispatcher":
					var cfg struct {
						NATS   struct{ URL, CredentialsFile string }
						Stream struct{ Replicas int }
					}
					configFile(t, o, "dispatcher.yaml", &cfg)
					check("nats.url", cfg.NATS.URL, tc.url)
					check("nats.credentialsFile", cfg.NATS.CredentialsFile, credsFile)
					check("stream.replicas", fmt.Sprint(cfg.Stream.Replicas), tc.replicas)
				case o.GetKind() == "ConfigMap" && o.GetName() == "t-gateway":
					var cfg struct {
						Queue struct{ URL, CredsFile string }
					}
					configFile(t, o, "gateway.yaml", &cfg)
					check("queue.url", cfg.Queue.URL, tc.url)
					check("queue.credsFile", cfg.Queue.CredsFile, credsFile)
				case o.GetKind() == "Deployment" || o.GetKind() == "StatefulSet":
					var tmpl corev1.PodTemplateSpec
					spec, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &tmpl); err != nil {
						t.Fatal(err)
					}
					if tmpl.Labels["modelorchestra.io/nats-client"] != "true" {
						continue
					}
					clients++
					secret := ""
					for _, v := range tmpl.Spec.Volumes {
						if v.Secret != nil && v.Name == "nats-credentials" {
							secret = v.Secret.SecretName
						}
					}
					check("the credentials volume's Secret", secret, tc.creds)
					for _, c := range tmpl.Spec.Containers {
						env := map[string]string{}
						for _, e := range c.Env {
							env[e.Name] = e.Value
						}
						check("NATS_URL", env["NATS_URL"], tc.url)
						check("NATS_STREAM_REPLICAS", env["NATS_STREAM_REPLICAS"], tc.replicas)
						check("NATS_CREDENTIALS_DIR", env["NATS_CREDENTIALS_DIR"], credsDir)
					}
				}
			}
			if clients != 2 {
				t.Errorf("%d NATS client workloads, want 2 (gateway and dispatcher)", clients)
			}
			if inCluster := tc.creds == ""; inCluster != seen["Service/t-nats"] || inCluster != seen["StatefulSet/t-nats"] {
				t.Errorf("the in-cluster server's Service and StatefulSet rendered: %v, %v; want %v (the URL is %s)", seen["Service/t-nats"], seen["StatefulSet/t-nats"], inCluster, tc.url)
			}
		})
	}
}

// configFile decodes the configuration file in data key key of a ConfigMap.
func configFile(t *testing.T, cm *unstructured.Unstructured, key string, into any) {
	t.Helper()
	raw, _, _ := unstructured.NestedString(cm.Object, "data", key)
	if err := yaml.Unmarshal([]byte(raw), into); err != nil {
		t.Fatalf("ConfigMap %s: %s: %v", cm.GetName(), key, err)
	}
}
