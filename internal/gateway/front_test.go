package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/model-orchestra/operator/internal/queue"
)

// rawExchange sends req as it is on a new connection to srvURL and reads
// one response.
func rawExchange(t *testing.T, srvURL, req string) (*http.Response, string) {
	t.Helper()
	u, err := url.Parse(srvURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", req, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// isOpenAIError reports whether body is an OpenAI error object with a
// message and a type.
func isOpenAIError(body string) bool {
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	return json.Unmarshal([]byte(body), &e) == nil && e.Error != nil && e.Error.Message != "" && e.Error.Type != ""
}

// TestEveryAnswerIsOpenAIShaped sends malformed and unusual requests as raw
// bytes: everything that reaches the gateway's code is answered with an
// OpenAI error object (or served, for a path that cleans to an API route),
// never with a redirect or a plain-text body. What Go's HTTP server answers
// before any handler runs is listed as such, with the status docs/gateway.md
// documents.
func TestEveryAnswerIsOpenAIShaped(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	auth := "Authorization: Bearer " + aliceToken + "\r\n"
	chat := "Content-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(chatBody)) + "\r\n\r\n" + chatBody
	tests := []struct {
		name, req string
		status    int
		// goServer: answered by net/http before the gateway's handler
		// runs, with a plain-text body (documented, not ours to shape).
		goServer bool
		// wantIn is a substring of the body.
		wantIn string
	}{
		{name: "dot-dot escaping the API", req: "GET /v1/models/../../etc/passwd HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 404, wantIn: "Invalid URL (GET /etc/passwd)"},
		{name: "percent-encoded dot-dot", req: "GET /v1/models/%2e%2e/%2e%2e/etc/passwd HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 404, wantIn: "Invalid URL (GET /etc/passwd)"},
		{name: "double slash that is not a route", req: "GET //etc HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 404, wantIn: "Invalid URL (GET /etc)"},
		{name: "double slash cleaning to a route is served", req: "GET //v1//models HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 200, wantIn: `"object":"list"`},
		{name: "dot segment cleaning to a route is served", req: "POST /v1/./chat/completions HTTP/1.1\r\nHost: x\r\n" + auth + chat,
			status: 200, wantIn: `"chat.completion"`},
		{name: "dot-dot within the API to a route", req: "GET /v1/chat/../models/small HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 200, wantIn: `"id":"small"`},
		{name: "empty model name", req: "GET /v1/models/ HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 404, wantIn: "model_not_found"},
		{name: "CONNECT", req: "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
			status: 404, wantIn: "Invalid URL (CONNECT example.com:443)"},
		{name: "unknown method", req: "BREW /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 404, wantIn: "Invalid URL (BREW /v1/models)"},
		{name: "absolute-form request target", req: "GET http://x/v1/../admin HTTP/1.1\r\nHost: x\r\n" + auth + "\r\n",
			status: 404, wantIn: "Invalid URL (GET /admin)"},
		{name: "broken chunked body", req: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth +
			"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
			status: 400, wantIn: "Could not read the request body."},
		{name: "HTTP/1.0 without Host", req: "GET /v1/models HTTP/1.0\r\n" + auth + "\r\n",
			status: 200, wantIn: `"object":"list"`},

		{name: "HTTP/1.1 without Host", req: "GET /v1/models HTTP/1.1\r\n" + auth + "\r\n",
			status: 400, goServer: true},
		{name: "unsupported transfer encoding", req: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
			status: 501, goServer: true},
		{name: "unsupported HTTP version", req: "GET /v1/models HTTP/3.0\r\nHost: x\r\n\r\n",
			status: 505, goServer: true},
		{name: "malformed request line", req: "GET\r\nHost: x\r\n\r\n",
			status: 400, goServer: true},
		{name: "malformed header line", req: "GET /v1/models HTTP/1.1\r\nHost: x\r\nno colon\r\n\r\n",
			status: 400, goServer: true},
		{name: "unsupported Expect", req: "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\nContent-Length: 2\r\n\r\n{}",
			status: 417, goServer: true},
		{name: "headers larger than the server reads", req: "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 1<<20+4096) + "\r\n\r\n",
			status: 431, goServer: true},
		{name: "OPTIONS *", req: "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
			status: 200, goServer: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, body := rawExchange(t, h.srv.URL, tt.req) //nolint:bodyclose // rawExchange read it and closed the connection
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d; body %q", resp.StatusCode, tt.status, body)
			}
			if loc := resp.Header.Get("Location"); loc != "" {
				t.Errorf("answered with a redirect to %q", loc)
			}
			switch {
			case tt.goServer:
				if isOpenAIError(body) {
					t.Errorf("expected Go's own answer, got an OpenAI error %q: update the test and docs/gateway.md", body)
				}
			case resp.StatusCode >= 400:
				if !isOpenAIError(body) || resp.Header.Get("Content-Type") != "application/json" {
					t.Errorf("body %q (Content-Type %q) is not an OpenAI error object", body, resp.Header.Get("Content-Type"))
				}
			}
			if !strings.Contains(body, tt.wantIn) {
				t.Errorf("body %q does not contain %q", body, tt.wantIn)
			}
		})
	}
}

// TestModelNoDispatcherServesFailsAtOnce checks the answer to a request for
// a configured model whose application no dispatcher serves: an immediate
// 503 model_not_served that the official SDKs do not retry
// (X-Should-Retry: false), rather than a wait and a retryable 503.
func TestModelNoDispatcherServesFailsAtOnce(t *testing.T) {
	h := newHarness(t, testConfig(), newEngine(engineOptions{}))
	h.q.submitErr = fmt.Errorf("%w: no dispatcher announced application llama for 31s", queue.ErrNotServed)
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	wantError(t, resp, body, 503, `{"error":{"message":"The model exists but no dispatcher serves it: none has announced its application for longer than a request may wait. Ask the operator of this gateway to check the dispatchers.","type":"server_error","param":"model","code":"model_not_served"}}`)
	if got := resp.Header.Get("X-Should-Retry"); got != "false" {
		t.Errorf("X-Should-Retry = %q, want false", got)
	}
	if got := resp.Header.Get("Retry-After"); got != "" {
		t.Errorf("Retry-After = %q, want none", got)
	}

	// The SDK, allowed two retries, asks once.
	c := openai.NewClient(option.WithBaseURL(h.srv.URL+"/v1/"), option.WithAPIKey(aliceToken), option.WithMaxRetries(2))
	calls := 0
	_, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:    "llama-3-8b",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hi")},
	}, option.WithMiddleware(func(r *http.Request, next option.MiddlewareNext) (*http.Response, error) {
		calls++
		return next(r)
	}))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || apiErr.Code != "model_not_served" {
		t.Fatalf("SDK error = %v, want 503 model_not_served", err)
	}
	if calls != 1 {
		t.Errorf("the SDK sent %d requests, want 1 (no retries)", calls)
	}
	eventually(t, 5*time.Second, metricEquals("rejections_total{reason=model_not_served}", h.g.metrics.rejections.WithLabelValues(reasonModelNotServed), 2))
}

// TestModelRefusedByTheOperatorFailsAtOnce checks the answer to a request
// for a model the operator refused (ModelConfig.Unavailable, for example a
// model too large for its engine's memory, which runs no engine pod): an
// immediate 503 model_not_served naming the refusal, not retried by the
// SDKs, and nothing queued.
func TestModelRefusedByTheOperatorFailsAtOnce(t *testing.T) {
	cfg := testConfig()
	cfg.Models[0].Unavailable = "the model does not fit the engine's memory limit: llama F16 needs about 12.5MiB, the limit is 1.0MiB"
	h := newHarness(t, cfg, newEngine(engineOptions{}))
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	wantError(t, resp, body, 503, `{"error":{"message":"The model `+"`llama-3-8b`"+` is not served: the model does not fit the engine's memory limit: llama F16 needs about 12.5MiB, the limit is 1.0MiB. Ask the operator of this gateway to change the deployment (for example a larger memory limit, a smaller model or weight type, or model.sizing).","type":"server_error","param":"model","code":"model_not_served"}}`)
	if got := resp.Header.Get("X-Should-Retry"); got != "false" {
		t.Errorf("X-Should-Retry = %q, want false", got)
	}
	if n := h.q.submitted(); n != 0 {
		t.Errorf("%d requests queued, want none", n)
	}
	// another model of the same gateway is served
	resp, body = h.do(t, "POST", "/v1/chat/completions", aliceToken, strings.Replace(chatBody, "llama-3-8b", "small", 1))
	if resp.StatusCode != 200 {
		t.Errorf("the other model: status %d %s", resp.StatusCode, body)
	}
}
