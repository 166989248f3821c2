package orchestra

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/plugin"
)

var updateProxyEnv = flag.Bool("update-proxyenv", false, "rewrite testdata/proxyenv/*.golden.yaml")

// setProxyEnv sets the operator's proxy environment as OLM injects it.
func setProxyEnv(t *testing.T) {
	t.Setenv("HTTP_PROXY", "http://proxy.corp.example:3128")
	t.Setenv("HTTPS_PROXY", "http://proxy.corp.example:3128")
	t.Setenv("NO_PROXY", ".cluster.local,.svc,10.0.0.0/16,172.30.0.0/16")
}

func clearProxyEnv(t *testing.T) {
	for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"} {
		t.Setenv(k, "")
		_ = os.Unsetenv(k)
	}
}

func readObjects(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []*unstructured.Unstructured
	for _, doc := range strings.Split(string(data), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

func writeObjects(t *testing.T, objs []*unstructured.Unstructured) []byte {
	t.Helper()
	var buf bytes.Buffer
	for i, o := range objs {
		if i > 0 {
			buf.WriteString("---\n")
		}
		b, err := yaml.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
	}
	return buf.Bytes()
}

// TestProxyEnvGolden runs proxy-env with the proxy environment OLM injects
// (read through operator-lib) over the chart's workloads: the fetch Job and
// the engines get the six variables, the engine's own https_proxy wins over
// both HTTPS_PROXY twins, the gateway and the ConfigMap are untouched.
func TestProxyEnvGolden(t *testing.T) {
	clearProxyEnv(t)
	setProxyEnv(t)
	pr, err := NewProxyEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := readObjects(t, "testdata/proxyenv/workloads.input.yaml")
	out, err := pr.PostRender(context.Background(), plugin.RenderContext{}, objs)
	if err != nil {
		t.Fatal(err)
	}
	got := writeObjects(t, out)
	golden := "testdata/proxyenv/workloads.golden.yaml"
	if *updateProxyEnv {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/orchestra -run TestProxyEnvGolden -update-proxyenv)", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s (-want +got):\n%s", filepath.Base(golden), d)
	}

	// Spot checks, so that a wrong golden file cannot pass unnoticed.
	env := func(i int, init bool, c int) map[string]string {
		tmpl := template(t, out[i])
		cs := tmpl.Spec.Containers
		if init {
			cs = tmpl.Spec.InitContainers
		}
		m := map[string]string{}
		for _, e := range cs[c].Env {
			m[e.Name] = e.Value
		}
		return m
	}
	fetch := env(0, false, 0)
	for _, k := range []string{"HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"} {
		if fetch[k] == "" {
			t.Errorf("fetch Job lacks %s", k)
		}
	}
	if engine := env(1, false, 0); engine["https_proxy"] != "http://engine-proxy.example:3128" || engine["HTTPS_PROXY"] != "" || engine["HTTP_PROXY"] == "" {
		t.Errorf("root engine env = %v: the user's https_proxy must win, HTTP_PROXY be added", engine)
	}
	if initEnv := env(1, true, 0); initEnv["NO_PROXY"] == "" {
		t.Errorf("root init container lacks NO_PROXY: %v", initEnv)
	}
	if worker := env(2, false, 0); worker["HTTPS_PROXY"] == "" {
		t.Errorf("worker lacks HTTPS_PROXY: %v", worker)
	}
	if gw := env(3, false, 0); len(gw) != 0 {
		t.Errorf("gateway got %v; it downloads nothing", gw)
	}
}

// Without proxy variables the post-renderer changes nothing and adds
// nothing to the release digest.
func TestProxyEnvWithoutProxyIsANoOp(t *testing.T) {
	clearProxyEnv(t)
	pr, err := NewProxyEnv(nil)
	if err != nil {
		t.Fatal(err)
	}
	in := readObjects(t, "testdata/proxyenv/workloads.input.yaml")
	want := writeObjects(t, in)
	out, err := pr.PostRender(context.Background(), plugin.RenderContext{}, in)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(string(want), string(writeObjects(t, out))); d != "" {
		t.Errorf("changed without a proxy (-want +got):\n%s", d)
	}
	if d := pr.(*proxyEnv).DigestConfig(); d != nil {
		t.Errorf("DigestConfig = %s, want nil", d)
	}
}

// The proxy settings are part of the release digest, so that a changed
// cluster proxy upgrades the releases.
func TestProxyEnvDigestFollowsTheProxy(t *testing.T) {
	a, _ := newProxyEnv(nil, []corev1.EnvVar{{Name: "HTTPS_PROXY", Value: "http://a:3128"}})
	b, _ := newProxyEnv(nil, []corev1.EnvVar{{Name: "HTTPS_PROXY", Value: "http://b:3128"}})
	if string(a.DigestConfig()) == string(b.DigestConfig()) {
		t.Errorf("two proxies, one digest input: %s", a.DigestConfig())
	}
}

func TestProxyEnvConfig(t *testing.T) {
	env := []corev1.EnvVar{{Name: "HTTPS_PROXY", Value: "http://p:3128"}}
	p, err := newProxyEnv(json.RawMessage(`{"components":["gateway"]}`), env)
	if err != nil {
		t.Fatal(err)
	}
	objs := readObjects(t, "testdata/proxyenv/workloads.input.yaml")
	out, err := p.PostRender(context.Background(), plugin.RenderContext{}, objs)
	if err != nil {
		t.Fatal(err)
	}
	if got := template(t, out[3]).Spec.Containers[0].Env; len(got) != 1 || got[0].Name != "HTTPS_PROXY" {
		t.Errorf("gateway env = %v, want HTTPS_PROXY", got)
	}
	if got := template(t, out[0]).Spec.Containers[0].Env; len(got) != 1 {
		t.Errorf("fetch Job env = %v, want only its own MODEL_URL", got)
	}
	for _, bad := range []string{`{"components":[""]}`, `{"component":["x"]}`} {
		if _, err := newProxyEnv(json.RawMessage(bad), env); err == nil {
			t.Errorf("config %s accepted", bad)
		}
	}
}
