package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const streamBody = `{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"Hi"}]}`

func TestRequestsPerMinute(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.Default.RequestsPerMinute = 2
	h := newHarness(t, cfg, newEngine(engineOptions{}))
	for i := range 2 {
		if resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
	}
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	wantError(t, resp, body, http.StatusTooManyRequests,
		`{"error":{"message":"Rate limit reached for alice: requests per minute limit 2 exhausted. Please try again in 30s.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
	if ra := resp.Header.Get("Retry-After"); ra != "30" {
		t.Errorf("Retry-After = %q, want 30", ra)
	}
	// Budgets are per token: bob is unaffected.
	body = `{"model":"small","messages":[{"role":"user","content":"Hi"}]}`
	if resp, got := h.do(t, "POST", "/v1/chat/completions", bobToken, body); resp.StatusCode != 200 {
		t.Errorf("bob: %d %s", resp.StatusCode, got)
	}
	eventually(t, 5*time.Second, metricEquals("rejections_total{reason=requests_per_minute}", h.g.metrics.rejections.WithLabelValues(reasonRequestRate), 1))
	if n := h.q.submitted(); n != 3 {
		t.Errorf("%d jobs reached the queue, want 3", n)
	}
}

func TestTokensPerMinute(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.Default.TokensPerMinute = 5
	h := newHarness(t, cfg, newEngine(engineOptions{}))
	// The first request may cost more than a minute's budget: it is
	// admitted alone, with a full budget. It is settled at the 11 tokens
	// it spent, which puts the token 6 tokens in debt.
	if resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, streamBody); resp.StatusCode != 200 {
		t.Fatalf("first request: %d %s", resp.StatusCode, body)
	}
	eventually(t, 5*time.Second, metricEquals("tokens_total{kind=completion}", h.g.metrics.tokens.WithLabelValues("llama-3-8b", "alice", "completion"), fakeCompletionTokens))
	eventually(t, 5*time.Second, holds("the tokens to be settled", func() bool {
		ok, _ := h.g.limiter.state(&Principal{Name: "alice"}).tokens.reserve(time.Now(), 5, 5)
		return !ok
	}))
	// The next one needs a full budget again: 11 tokens at 5 a minute.
	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody)
	wantError(t, resp, body, http.StatusTooManyRequests,
		fmt.Sprintf(`{"error":{"message":"Rate limit reached for alice: tokens per minute limit 5 exhausted (this request may use up to %d). Please try again in 2m12s.","type":"tokens","param":null,"code":"rate_limit_exceeded"}}`,
			estimateTokens(len(chatBody), cfg.Limits.AssumedMaxTokens)))
	if ra := resp.Header.Get("Retry-After"); ra != "132" {
		t.Errorf("Retry-After = %q, want 132", ra)
	}
}

// TestTokensPerMinuteHoldsUnderConcurrency: concurrent requests reserve
// their maximum at admission, so the limit holds within one request's
// size however many arrive at once (all 20 used to be admitted).
func TestTokensPerMinuteHoldsUnderConcurrency(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.Default.TokensPerMinute = 200
	hold := make(chan struct{})
	h := newHarness(t, cfg, newEngine(engineOptions{hold: hold}))
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)

	const body = `{"model":"llama-3-8b","max_tokens":40,"stream":true,"messages":[{"role":"user","content":"Hi"}]}`
	var wg sync.WaitGroup
	statuses := make(chan int, 20)
	for range 20 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer func() { _ = resp.Body.Close() }()
			_, _ = io.ReadAll(resp.Body)
			statuses <- resp.StatusCode
		})
	}
	// The rejected ones answer while the admitted ones are held.
	eventually(t, 5*time.Second, holds("every request to be admitted or refused", func() bool {
		return len(statuses)+h.q.submitted() >= 20
	}))
	release()
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	// The streamed body sent to the engine asks for usage: a little longer.
	perRequest := estimateTokens(len(body)+len(`,"stream_options":{"include_usage":true}`), 40)
	if want := 200 / perRequest; count[200] != want || count[429] != 20-want {
		t.Errorf("statuses = %v, want %d admitted (200 tokens / %d reserved each) and the rest 429", count, want, perRequest)
	}
	// Settled at what they spent: the reservations are given back.
	eventually(t, 5*time.Second, holds("the reservations to be settled", func() bool {
		ok, _ := h.g.limiter.state(&Principal{Name: "alice"}).tokens.reserve(time.Now(), 200, 150)
		return ok
	}))
}

func TestMaxConcurrentStreams(t *testing.T) {
	cfg := testConfig()
	cfg.Limits.Default.MaxConcurrent = 1
	hold := make(chan struct{})
	h := newHarness(t, cfg, newEngine(engineOptions{hold: hold}))
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release)

	first := make(chan string)
	go func() {
		req, _ := http.NewRequest("POST", h.srv.URL+"/v1/chat/completions", strings.NewReader(streamBody))
		req.Header.Set("Authorization", "Bearer "+aliceToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- err.Error()
			return
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		first <- string(b)
	}()
	eventually(t, 5*time.Second, holds("the first stream to start", func() bool { return h.q.submitted() == 1 }))

	resp, body := h.do(t, "POST", "/v1/chat/completions", aliceToken, streamBody)
	wantError(t, resp, body, http.StatusTooManyRequests,
		`{"error":{"message":"Rate limit reached for alice: at most 1 concurrent streams. Please try again when a stream ends.","type":"requests","param":null,"code":"rate_limit_exceeded"}}`)
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After = %q, want a number of seconds", resp.Header.Get("Retry-After"))
	}
	// The limit is on streams only.
	if resp, got := h.do(t, "POST", "/v1/chat/completions", aliceToken, chatBody); resp.StatusCode != 200 {
		t.Errorf("non-streaming request during a stream: %d %s", resp.StatusCode, got)
	}

	release()
	if body := <-first; !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Errorf("first stream = %q, want it complete", body)
	}
	eventually(t, 5*time.Second, holds("the stream slot to be released", func() bool {
		resp, _ := h.do(t, "POST", "/v1/chat/completions", aliceToken, streamBody)
		return resp.StatusCode == 200
	}))
}

func TestBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b bucket
	for i := range 3 {
		if ok, _ := b.take(t0, 3, 1); !ok {
			t.Fatalf("take %d refused within the burst", i)
		}
	}
	ok, wait := b.take(t0, 3, 1)
	if ok || wait != 20*time.Second {
		t.Errorf("take beyond the burst = %v, %s; want refused, 20s", ok, wait)
	}
	if ok, _ := b.take(t0.Add(20*time.Second), 3, 1); !ok {
		t.Error("take refused after refilling one")
	}
	// A lowered limit caps the level at once.
	var c bucket
	c.take(t0, 100, 1)
	if ok, _ := c.take(t0, 2, 2); !ok {
		t.Error("take refused after lowering the limit to 2")
	}
	if ok, _ := c.take(t0, 2, 1); ok {
		t.Error("lowered limit still allowed the old budget")
	}
	// Reservations: what the budget holds, or anything with a full budget.
	var d bucket
	if ok, _ := d.reserve(t0, 60, 90); !ok {
		t.Error("a full budget refused a reservation larger than itself")
	}
	if ok, wait := d.reserve(t0, 60, 1); ok || wait.Round(time.Second) != 31*time.Second {
		t.Errorf("reserve in debt = %v, %s; want refused, 31s", ok, wait)
	}
	d.charge(t0, 60, -80) // settled: 10 spent of the 90 reserved
	if ok, _ := d.reserve(t0, 60, 50); !ok {
		t.Error("reserve refused after the reservation was settled")
	}
	if ok, _ := d.reserve(t0, 60, 1); ok {
		t.Error("reserve allowed beyond the budget")
	}
}
