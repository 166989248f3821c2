package dataplanetest_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/gateway"
)

// post sends a chat body to the gateway and returns the status and body.
func post(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// chatOfSize is a chat request body of exactly n bytes.
func chatOfSize(n int) []byte {
	head, tail := `{"model":"sim-model","messages":[{"role":"user","content":"`, `"}]}`
	return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
}

// TestBodyJustUnderTheLimitIsServed: a body of limits.maxBodyBytes is
// queued and answered (it used to get 503 with Retry-After, forever, because
// NATS refused it once its headers were added); one byte more is a 413.
func TestBodyJustUnderTheLimitIsServed(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), nil)
	dispatcher(t, s)
	limit := gateway.Default().Limits.MaxBodyBytes
	if status, body := post(t, s.Gateway.URL, chatOfSize(int(limit))); status != 200 {
		t.Errorf("body of maxBodyBytes: %d %.300s", status, body)
	}
	if status, body := post(t, s.Gateway.URL, chatOfSize(int(limit)+1)); status != 413 {
		t.Errorf("body of maxBodyBytes+1: %d %.300s, want 413", status, body)
	}
}
