package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
type ChatResult struct {
	Content      string
	FinishReason string
	// Chunks is the number of SSE events with a content delta.
	Chunks int
	// Events is the number of SSE events of the answer (the role, content
	// and finish events; not an error event, not [DONE]).
	Events int
	// Done is true when the stream ended with "data: [DONE]".
	Done bool
}

// Answered is true when the stream ended with [DONE] after a finish reason:
// the engine generated an answer. Its text may be empty with the generated
// test models: their random weights sometimes draw only tokens that decode
// to no text within max_tokens (bytes of an unfinished UTF-8 sequence,
// which Ollama holds back, or the end token first).
func (r *ChatResult) Answered() bool {
	return r != nil && r.Done && r.FinishReason != ""
}

// APIError is an OpenAI-style error answer.
type APIError struct {
	Status  int
	Message string
	Type    string
	Code    string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("HTTP %d %s (%s): %s", e.Status, e.Code, e.Type, e.Message)
}

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
	body, _ := json.Marshal(map[string]any{
		"model":      model,
		"stream":     true,
		"max_tokens": maxTokens,
		"messages":   []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+"/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", req.URL, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, readAPIError(resp)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return nil, fmt.Errorf("expected an event stream, got Content-Type %q", ct)
	}
	return ReadChatStream(resp.Body, onDelta)
}

// ReadChatStream reads a chat completion event stream to its end, calling
// onDelta (if set) with each piece of the answer. An error event, or a
// stream without [DONE], is an error; an error event is an *APIError with
// Status 200.
func ReadChatStream(body io.Reader, onDelta func(string)) (*ChatResult, error) {
	res := &ChatResult{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data:")
		if !ok {
			continue
		}
		data = strings.TrimSpace(data)
		if data == "[DONE]" {
			res.Done = true
			break
		}
		var ev struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Error *struct {
				Message string `json:"message"`
				Type    string `json:"type"`
				Code    any    `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return res, fmt.Errorf("decoding stream event %q: %w", data, err)
		}
		if ev.Error != nil {
			return res, &APIError{Status: http.StatusOK, Message: ev.Error.Message, Type: ev.Error.Type, Code: fmt.Sprint(ev.Error.Code)}
		}
		res.Events++
		for _, c := range ev.Choices {
			if c.Delta.Content != "" {
				res.Content += c.Delta.Content
				res.Chunks++
				if onDelta != nil {
					onDelta(c.Delta.Content)
				}
			}
			if c.FinishReason != nil {
				res.FinishReason = *c.FinishReason
			}
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("reading the stream: %w", err)
	}
	if !res.Done {
		return res, fmt.Errorf("the stream ended without [DONE] after %d chunks", res.Chunks)
	}
	return res, nil
}

func readAPIError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error.Message == "" {
		return &APIError{Status: resp.StatusCode, Message: strings.TrimSpace(string(data))}
	}
	return &APIError{Status: resp.StatusCode, Message: e.Error.Message, Type: e.Error.Type, Code: fmt.Sprint(e.Error.Code)}
}
