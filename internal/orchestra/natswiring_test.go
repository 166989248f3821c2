package orchestra

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/plugin"
)

const oneApp = `{applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`

func natsClient(containers ...corev1.Container) corev1.PodTemplateSpec {
	p := pod(containers...)
	p.ObjectMeta = metav1.ObjectMeta{Labels: map[string]string{"modelorchestra.io/nats-client": "true"}}
	return p
}

func natsService(name string) *unstructuredT {
	return &unstructuredT{Object: map[string]any{
		"apiVersion": "v1", "kind": "Service",
		"metadata": map[string]any{"name": name, "namespace": "ns"},
	}}
}

func TestNATSWiring(t *testing.T) {
	staleEnv := []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: EnvNATSURL, Value: "nats://elsewhere:4222"}, {Name: "B", Value: "2"}}
	cases := []struct {
		name      string
		spec      string
		objs      func(t *testing.T) []*unstructuredT
		wantEnv   map[string][]corev1.EnvVar // by workload name
		wantMount bool
		wantErr   string
	}{
		{
			name: "in-cluster server: every client gets its Service URL",
			spec: oneApp,
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{
					natsService("demo-nats"),
					workload(t, "Deployment", "gateway", natsClient(corev1.Container{Name: "gateway", Env: staleEnv})),
					workload(t, "Deployment", "dispatcher", natsClient(corev1.Container{Name: "dispatcher"})),
				}
			},
			wantEnv: map[string][]corev1.EnvVar{
				// A stale URL is replaced in place; other variables keep their order.
				"gateway":    {{Name: "A", Value: "1"}, {Name: EnvNATSURL, Value: "nats://demo-nats.ns.svc:4222"}, {Name: "B", Value: "2"}, {Name: EnvNATSStreamReplicas, Value: "1"}},
				"dispatcher": {{Name: EnvNATSURL, Value: "nats://demo-nats.ns.svc:4222"}, {Name: EnvNATSStreamReplicas, Value: "1"}},
			},
		},
		{
			name: "external cluster with credentials",
			spec: `{nats: {url: "nats://a:4222,nats://b:4222", credentialsSecretRef: {name: nats-creds}, replicas: 3}, applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`,
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{workload(t, "Deployment", "gateway", natsClient(corev1.Container{Name: "gateway"}))}
			},
			wantEnv: map[string][]corev1.EnvVar{
				"gateway": {{Name: EnvNATSURL, Value: "nats://a:4222,nats://b:4222"}, {Name: EnvNATSStreamReplicas, Value: "3"}, {Name: EnvNATSCredentialsDir, Value: "/etc/orchestra/nats"}},
			},
			wantMount: true,
		},
		{
			name: "pods that are not NATS clients are untouched",
			spec: oneApp,
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{natsService("demo-nats"), workload(t, "StatefulSet", "engine", pod(corev1.Container{Name: "engine"}))}
			},
			wantEnv: map[string][]corev1.EnvVar{"engine": nil},
		},
		{
			name: "a client without the in-cluster Service is an error",
			spec: oneApp,
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{workload(t, "Deployment", "gateway", natsClient(corev1.Container{Name: "gateway"}))}
			},
			wantErr: "names Service demo-nats, which the chart did not render",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := NewNATSWiring(nil)
			if err != nil {
				t.Fatal(err)
			}
			out, err := pr.PostRender(context.Background(), plugin.RenderContext{Owner: owner(t, tc.spec)}, tc.objs(t))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range out {
				want, ok := tc.wantEnv[o.GetName()]
				if !ok {
					continue
				}
				tmpl := template(t, o)
				if diff := cmp.Diff(want, tmpl.Spec.Containers[0].Env); diff != "" {
					t.Errorf("%s env (-want +got):\n%s", o.GetName(), diff)
				}
				hasMount := len(tmpl.Spec.Containers[0].VolumeMounts) == 1 && len(tmpl.Spec.Volumes) == 1 &&
					tmpl.Spec.Volumes[0].Secret != nil && tmpl.Spec.Volumes[0].Secret.SecretName == "nats-creds"
				if hasMount != tc.wantMount {
					t.Errorf("%s credentials mounted = %v, want %v (volumes %v)", o.GetName(), hasMount, tc.wantMount, tmpl.Spec.Volumes)
				}
			}
		})
	}
}

// TestNATSWiringDropsRemovedCredentials: removing credentialsSecretRef
// removes the volume, the mount and the variable from every client.
func TestNATSWiringDropsRemovedCredentials(t *testing.T) {
	pr, err := NewNATSWiring(nil)
	if err != nil {
		t.Fatal(err)
	}
	withCreds := owner(t, `{nats: {url: "nats://a:4222", credentialsSecretRef: {name: c}}, applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`)
	withoutCreds := owner(t, `{nats: {url: "nats://a:4222"}, applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`)
	objs := []*unstructuredT{workload(t, "Deployment", "gateway", natsClient(corev1.Container{Name: "gateway"}))}
	objs, err = pr.PostRender(context.Background(), plugin.RenderContext{Owner: withCreds}, objs)
	if err != nil {
		t.Fatal(err)
	}
	objs, err = pr.PostRender(context.Background(), plugin.RenderContext{Owner: withoutCreds}, objs)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(t, objs[0])
	if len(tmpl.Spec.Volumes) != 0 || len(tmpl.Spec.Containers[0].VolumeMounts) != 0 {
		t.Errorf("credentials still mounted: %v %v", tmpl.Spec.Volumes, tmpl.Spec.Containers[0].VolumeMounts)
	}
	for _, e := range tmpl.Spec.Containers[0].Env {
		if e.Name == EnvNATSCredentialsDir {
			t.Errorf("%s still set", EnvNATSCredentialsDir)
		}
	}
}

func TestNATSWiringConfigFile(t *testing.T) {
	pr, err := NewNATSWiring(nil)
	if err != nil {
		t.Fatal(err)
	}
	cm := configMap("demo-dispatcher", map[string]any{"dispatcher.yaml": "orchestra: demo\nnats:\n  url: nats://stale:4222\nstream:\n  replicas: 1\napps: [{name: chat}]\n"})
	cm.SetAnnotations(map[string]string{AnnotationNATSConfig: "dispatcher.yaml"})
	spec := `{nats: {url: "tls://nats.example:4222", credentialsSecretRef: {name: creds}, replicas: 3}, applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`
	out, err := pr.PostRender(context.Background(), plugin.RenderContext{Owner: owner(t, spec)}, []*unstructuredT{cm})
	if err != nil {
		t.Fatal(err)
	}
	got, _, _ := unstructured.NestedString(out[0].Object, "data", "dispatcher.yaml")
	want := "apps:\n- name: chat\nnats:\n  credentialsFile: /etc/orchestra/nats/creds\n  url: tls://nats.example:4222\norchestra: demo\nstream:\n  replicas: 3\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dispatcher.yaml (-want +got):\n%s", diff)
	}

	// The gateway keeps its settings elsewhere, and without a stream.
	gw := configMap("demo-gateway", map[string]any{"gateway.yaml": "queue:\n  orchestra: demo\n"})
	gw.SetAnnotations(map[string]string{AnnotationNATSConfig: "gateway.yaml"})
	out, err = pr.PostRender(context.Background(), plugin.RenderContext{Owner: owner(t, spec)}, []*unstructuredT{gw})
	if err != nil {
		t.Fatal(err)
	}
	got, _, _ = unstructured.NestedString(out[0].Object, "data", "gateway.yaml")
	want = "queue:\n  credsFile: /etc/orchestra/nats/creds\n  orchestra: demo\n  url: tls://nats.example:4222\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gateway.yaml (-want +got):\n%s", diff)
	}

	for key, wantErr := range map[string]string{
		"gateway.yaml": `names data key "gateway.yaml", which it does not have`,
		"other.yaml":   `names "other.yaml", a file without a configured layout`,
	} {
		cm.SetAnnotations(map[string]string{AnnotationNATSConfig: key})
		if _, err := pr.PostRender(context.Background(), plugin.RenderContext{Owner: owner(t, spec)}, []*unstructuredT{cm}); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("annotation %s: error = %v, want one containing %q", key, err, wantErr)
		}
	}
}

func TestNATSWiringConfig(t *testing.T) {
	for _, tc := range []struct{ config, wantErr string }{
		{`{"configFiles":[{"key":"a.yaml"}]}`, "configFiles[0]: key and url are required"},
		{`{"configFiles":[{"key":"a.yaml","url":"nats.url"},{"key":"a.yaml","url":"x"}]}`, `key "a.yaml" is listed twice`},
		{`{"credentialsPath":"relative"}`, "credentialsPath must be absolute"},
	} {
		if _, err := NewNATSWiring([]byte(tc.config)); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("config %s: error = %v, want one containing %q", tc.config, err, tc.wantErr)
		}
	}
}
