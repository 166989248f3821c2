package orchestra

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/version"
)

func TestTranslatorImages(t *testing.T) {
	env := map[string]string{"RELATED_IMAGE_GATEWAY": "registry.local/gw@sha256:abc", "RELATED_IMAGE_VLLM": " registry.local/vllm:1 "}
	vals, err := Translator{Getenv: func(k string) string { return env[k] }}.Translate(context.Background(), owner(t, oneApp))
	if err != nil {
		t.Fatal(err)
	}
	images := vals["global"].(map[string]any)["images"].(map[string]any)
	for key, want := range map[string]string{
		"gateway":    "registry.local/gw@sha256:abc",
		"vllm":       "registry.local/vllm:1",
		"dispatcher": version.Image("orchestra-dispatcher"),
		"nats":       version.Image("nats-server"),
		"llamacpp":   "ghcr.io/ggml-org/llama.cpp:full",
	} {
		if images[key] != want {
			t.Errorf("images.%s = %v, want %s", key, images[key], want)
		}
	}
	if len(images) != len(Images()) {
		t.Errorf("images has %d entries, want one per known image (%d)", len(images), len(Images()))
	}
}

func TestTranslatorValues(t *testing.T) {
	spec := `{gateway: {auth: {tokenSecretSelector: {matchLabels: {team: a}}, hmacKeySecretRef: {name: h}}, limits: {maxBodySize: 2Mi}, responses: {retention: 168h}},
  applications: {
    chat: {model: {source: "hf://org/repo", file: m.gguf}},
    kold: {model: {source: "pvc://models/llama", file: m.m, tokenizerFile: t.t}, runtime: {engine: dllama, workers: 3}, serving: {maxConcurrency: 8}}}}`
	vals, err := Translator{Getenv: func(string) string { return "" }}.Translate(context.Background(), owner(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) any {
		v, _, err := unstructured.NestedFieldNoCopy(vals, strings.Split(path, ".")...)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return v
	}
	for path, want := range map[string]any{
		"gateway.auth.secretSelector":                      "team=a",
		"gateway.auth.hmacKeySecretRef":                    map[string]any{"name": "h", "key": "token"},
		"gateway.limits.maxBodyBytes":                      int64(2 << 20),
		"gateway.responses.retention":                      "168h0m0s",
		"gateway.limits.requestsPerMinute":                 int64(600),
		"global.applications.chat.serving.servedModelName": "chat",
		"global.applications.chat.model.format":            "gguf",
		"global.applications.chat.model.cache":             map[string]any{"size": "20Gi", "accessMode": "ReadWriteOnce", "storageClassName": "", "existingClaim": ""},
		"global.applications.chat.scaling.replicas":        int64(1),
		// A pvc:// source is used in place: no cache.
		"global.applications.kold.model.cache":  nil,
		"global.applications.kold.model.format": "dllama",
		// distributed-llama answers one request at a time.
		"global.applications.kold.serving.maxConcurrency": int64(1),
		// JetStream cannot parse "10Gi": it gets the size in bytes.
		"nats.storage": map[string]any{"size": "10Gi", "maxFileStoreBytes": int64(10 << 30), "storageClassName": ""},
	} {
		if diff := cmp.Diff(want, get(path)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", path, diff)
		}
	}
}

func TestTranslatorRefusesEmptyTokenSelector(t *testing.T) {
	spec := `{gateway: {auth: {tokenSecretSelector: {}}}, applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}}`
	_, err := Translator{}.Translate(context.Background(), owner(t, spec))
	if err == nil || !strings.Contains(err.Error(), "spec.gateway.auth.tokenSecretSelector") {
		t.Fatalf("error = %v, want one naming spec.gateway.auth.tokenSecretSelector", err)
	}
}

// TestTranslatorResolvesNATSOnce: the translator is the one place that
// decides the NATS URL every client uses, and whether the in-cluster
// server is deployed.
func TestTranslatorResolvesNATSOnce(t *testing.T) {
	const apps = `applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}}}`
	for _, tc := range []struct {
		name, spec string
		global     map[string]any
		enabled    bool
	}{
		{
			name:    "in-cluster server",
			spec:    `{nats: {replicas: 3}, ` + apps + `}`,
			global:  map[string]any{"url": "nats://demo-nats.ns.svc:4222", "inCluster": true, "replicas": int64(3)},
			enabled: true,
		},
		{
			name:   "external server with credentials",
			spec:   `{nats: {url: "tls://a:4222,tls://b:4222", credentialsSecretRef: {name: creds}}, ` + apps + `}`,
			global: map[string]any{"url": "tls://a:4222,tls://b:4222", "inCluster": false, "replicas": int64(1), "credentialsSecretRef": map[string]any{"name": "creds"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals, err := Translator{Getenv: func(string) string { return "" }}.Translate(context.Background(), owner(t, tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.global, vals["global"].(map[string]any)["nats"]); diff != "" {
				t.Errorf("global.nats (-want +got):\n%s", diff)
			}
			if got := vals["nats"].(map[string]any)["enabled"]; got != tc.enabled {
				t.Errorf("nats.enabled = %v, want %v", got, tc.enabled)
			}
		})
	}
}
