package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes/fake"
)

const (
	testNamespace = "orchestra"
	tokenLabel    = "modelorchestra.io/api-token"
)

// tokenSecret builds a token Secret; labelled says whether it carries the
// selected label.
func tokenSecret(name string, labelled bool, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: testNamespace, Labels: map[string]string{}},
		Data:       map[string][]byte{},
	}
	if labelled {
		s.Labels[tokenLabel] = "true"
	}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

// secretHarness serves a gateway whose tokens come from Secrets in a fake
// clientset, watched by a real informer.
func secretHarness(t *testing.T, cfg Config, objs ...*corev1.Secret) (*harness, *fake.Clientset, *SecretTokens) {
	t.Helper()
	client := fake.NewClientset()
	for _, o := range objs {
		if _, err := client.CoreV1().Secrets(o.Namespace).Create(context.Background(), o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	logs := &syncBuffer{}
	st, err := NewSecretTokens(client, testNamespace, tokenLabel+"=true",
		NewTokenHasher([]byte("test-hmac-key-0123456789")), cfg.Limits.Default, slog.New(slog.NewJSONHandler(logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st.Start(ctx)
	if !st.WaitForSync(ctx) {
		t.Fatal("token secrets did not sync")
	}
	h := newHarnessWithTokens(t, cfg, newEngine(engineOptions{}), st)
	t.Cleanup(func() {
		if strings.Contains(logs.String(), "sk-") || strings.Contains(h.logs.String(), "sk-") {
			t.Error("a token was logged")
		}
	})
	return h, client, st
}

func TestSecretTokens(t *testing.T) {
	h, client, st := secretHarness(t, testConfig(),
		tokenSecret("alice", true, map[string]string{"token": "sk-alice-1\n", "name": "Alice's app"}),
		tokenSecret("bob", true, map[string]string{"token": "sk-bob-1", "models": " small , embed "}),
		tokenSecret("carol", false, map[string]string{"token": "sk-carol-1"}),
		tokenSecret("broken", true, map[string]string{"models": "small"}),
		tokenSecret("bad-limit", true, map[string]string{"token": "sk-bad-1", "requestsPerMinute": "lots"}),
	)
	ctx := context.Background()
	status := func(token, model string) int {
		resp, _ := h.do(t, "POST", "/v1/chat/completions", token,
			fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Hi"}]}`, model))
		return resp.StatusCode
	}
	for _, tc := range []struct {
		token, model string
		want         int
	}{
		{"sk-alice-1", "llama-3-8b", 200}, // a trailing newline in the Secret is ignored
		{"sk-bob-1", "small", 200},
		{"sk-bob-1", "llama-3-8b", 404}, // not in bob's models
		{"sk-carol-1", "small", 401},    // not selected by the label selector
		{"sk-bad-1", "small", 401},      // unusable Secret
	} {
		if got := status(tc.token, tc.model); got != tc.want {
			t.Errorf("%s using %s: status %d, want %d", tc.token, tc.model, got, tc.want)
		}
	}
	if got := h.g.metrics.apiTokens; got == nil {
		t.Fatal("no api_tokens gauge")
	}
	eventually(t, 5*time.Second, metricEquals("api_tokens", h.g.metrics.apiTokens, 2))

	// Rotation: the old token stops working, the new one works.
	rotated := tokenSecret("alice", true, map[string]string{"token": "sk-alice-2"})
	if _, err := client.CoreV1().Secrets(testNamespace).Update(ctx, rotated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, holds("the rotated token to work", func() bool { return status("sk-alice-2", "small") == 200 }))
	resp, body := h.do(t, "POST", "/v1/chat/completions", "sk-alice-1", chatBody)
	wantError(t, resp, body, http.StatusUnauthorized,
		`{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`)

	// Revocation by deleting the Secret.
	if err := client.CoreV1().Secrets(testNamespace).Delete(ctx, "bob", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, holds("the deleted token to be refused", func() bool { return status("sk-bob-1", "small") == 401 }))

	// Revocation by removing the label.
	unlabelled := tokenSecret("alice", false, map[string]string{"token": "sk-alice-2"})
	if _, err := client.CoreV1().Secrets(testNamespace).Update(ctx, unlabelled, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Second, holds("the unlabelled token to be refused", func() bool { return status("sk-alice-2", "small") == 401 }))

	// The informer's cache holds digests, never tokens.
	for _, obj := range st.informer.GetStore().List() {
		if _, ok := obj.(*tokenRecord); !ok {
			t.Errorf("informer cache holds a %T, want only token records", obj)
		}
		if s := fmt.Sprintf("%+v", obj); strings.Contains(s, "sk-") {
			t.Errorf("informer cache holds a token: %s", s)
		}
	}
}

func TestSecretLimitOverrides(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.Default.RequestsPerMinute = 100
	h, _, _ := secretHarness(t, cfg,
		tokenSecret("tight", true, map[string]string{"token": "sk-tight", "requestsPerMinute": "1"}),
		tokenSecret("free", true, map[string]string{"token": "sk-free", "requestsPerMinute": "0"}),
	)
	if resp, _ := h.do(t, "POST", "/v1/chat/completions", "sk-tight", chatBody); resp.StatusCode != 200 {
		t.Fatalf("first request: %d", resp.StatusCode)
	}
	resp, body := h.do(t, "POST", "/v1/chat/completions", "sk-tight", chatBody)
	wantError(t, resp, body, http.StatusTooManyRequests,
		`{"error":{"message":"Rate limit reached for tight: requests per minute limit 1 exhausted. Please try again in 1m0s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
	for i := range 150 {
		if resp, _ := h.do(t, "POST", "/v1/chat/completions", "sk-free", chatBody); resp.StatusCode != 200 {
			t.Fatalf("unlimited token refused at request %d: %d", i, resp.StatusCode)
		}
	}
}

// TestSecretMaxConcurrent: a token Secret sets its stream limit as
// maxConcurrent, or by the deprecated name maxConcurrentStreams that Secrets
// written before the rename use.
func TestSecretMaxConcurrent(t *testing.T) {
	st := &SecretTokens{hasher: NewTokenHasher(nil), selector: labels.Everything(), defaults: Limits{RequestsPerMinute: 600, MaxConcurrent: 16}}
	tests := []struct {
		name        string
		data        map[string]string
		want        int
		wantProblem string
	}{
		{"default", nil, 16, ""},
		{"maxConcurrent", map[string]string{"maxConcurrent": "3"}, 3, ""},
		{"deprecated maxConcurrentStreams", map[string]string{"maxConcurrentStreams": "4"}, 4, ""},
		{"both, the same", map[string]string{"maxConcurrent": "5", "maxConcurrentStreams": " 5\n"}, 5, ""},
		{"both, different", map[string]string{"maxConcurrent": "5", "maxConcurrentStreams": "6"}, 0,
			"data.maxConcurrent and data.maxConcurrentStreams, its deprecated name, differ: give data.maxConcurrent only"},
		{"not a number by the deprecated name", map[string]string{"maxConcurrentStreams": "many"}, 0,
			"data.maxConcurrentStreams must be a non-negative integer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := map[string]string{"token": "sk-t"}
			for k, v := range tt.data {
				data[k] = v
			}
			_, p, problem := st.parseSecret(tokenSecret("t", true, data))
			if problem != tt.wantProblem {
				t.Fatalf("problem %q, want %q", problem, tt.wantProblem)
			}
			if tt.wantProblem != "" {
				return
			}
			want := Limits{RequestsPerMinute: 600, MaxConcurrent: tt.want}
			if diff := cmp.Diff(want, p.Limits); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
		})
	}
}

func TestTokenHasher(t *testing.T) {
	plain := NewTokenHasher(nil)
	keyed := NewTokenHasher([]byte("key-0123456789abcdef"))
	// SHA-256("abc") is a published test vector.
	if got := fmt.Sprintf("%x", plain.Digest("abc")); got != "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" {
		t.Errorf("SHA-256 digest = %s", got)
	}
	if plain.Digest("abc") == keyed.Digest("abc") {
		t.Error("the keyed digest equals the plain one")
	}
	if keyed.Digest("abc") != NewTokenHasher([]byte("key-0123456789abcdef")).Digest("abc") {
		t.Error("the keyed digest is not deterministic")
	}
}
