package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/internal/ssetest"
)

// TokenLabel selects the API token Secrets the gateway accepts by default
// (docs/gateway.md).
const TokenLabel = "modelorchestra.io/api-token"

// EnsureToken returns the API token kept in Secret namespace/name, creating
// the Secret (labelled for the gateway, with a random token) if it does not
// exist.
func EnsureToken(ctx context.Context, cs kubernetes.Interface, namespace, name string) (string, error) {
	secrets := cs.CoreV1().Secrets(namespace)
	if s, err := secrets.Get(ctx, name, metav1.GetOptions{}); err == nil {
		if tok := strings.TrimSpace(string(s.Data["token"])); tok != "" && s.Labels[TokenLabel] == "true" {
			return tok, nil
		}
		if err := secrets.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("replacing API token Secret %s/%s: %w", namespace, name, err)
		}
	} else if !apierrors.IsNotFound(err) {
		return "", fmt.Errorf("reading API token Secret %s/%s: %w", namespace, name, err)
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	tok := "sk-demo-" + hex.EncodeToString(raw)
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{TokenLabel: "true"}},
		StringData: map[string]string{"token": tok, "name": name},
	}
	if _, err := secrets.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("creating API token Secret %s/%s: %w", namespace, name, err)
	}
	return tok, nil
}

// GatewayURL returns the OpenAI base URL of the stack's gateway as reached
// from the host: its Service must be a NodePort (or LoadBalancer) Service,
// and the local cluster answers NodePorts on 127.0.0.1.
func GatewayURL(ctx context.Context, cs kubernetes.Interface, namespace, name string) (string, error) {
	svcName := name + "-gateway"
	svc, err := cs.CoreV1().Services(namespace).Get(ctx, svcName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("reading the gateway Service %s/%s: %w", namespace, svcName, err)
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 && (p.Name == "http" || len(svc.Spec.Ports) == 1) {
			return fmt.Sprintf("http://127.0.0.1:%d/v1", p.NodePort), nil
		}
	}
	return "", fmt.Errorf("the gateway Service %s/%s (type %s) has no node port: set spec.gateway.service.type NodePort", namespace, svcName, svc.Spec.Type)
}

// ChatResult is what a streamed chat completion produced.
type ChatResult = ssetest.Result

// APIError is an OpenAI-style error answer.
type APIError = ssetest.APIError

// StreamChatOnceReachable is StreamChat for the first request after a
// stack turns Ready: Ready means the gateway has ready endpoints, but
// kube-proxy may program the NodePort a moment later. A request that fails
// before any answer arrived (a refused connection, or a 502 or 503) is
// retried every second for up to within.
func StreamChatOnceReachable(ctx context.Context, baseURL, token, model, prompt string, maxTokens int, onDelta func(string), within time.Duration) (*ChatResult, error) {
	deadline := time.Now().Add(within)
	for {
		started := false
		res, err := StreamChat(ctx, baseURL, token, model, prompt, maxTokens, func(s string) {
			started = true
			if onDelta != nil {
				onDelta(s)
			}
		})
		if err == nil || started || time.Now().After(deadline) {
			return res, err
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) && apiErr.Status != http.StatusServiceUnavailable && apiErr.Status != http.StatusBadGateway {
			return res, err
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// StreamChat sends one streaming chat completion and calls onDelta with
// each piece of the answer as it arrives. An error event inside the stream,
// or a stream without [DONE], is an error.
func StreamChat(ctx context.Context, baseURL, token, model, prompt string, maxTokens int, onDelta func(string)) (*ChatResult, error) {
	_, res, err := ssetest.Post(ctx, strings.TrimSuffix(baseURL, "/")+"/chat/completions", token, nil, map[string]any{
		"model":      model,
		"stream":     true,
		"max_tokens": maxTokens,
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
	}, onDelta)
	return res, err
}
