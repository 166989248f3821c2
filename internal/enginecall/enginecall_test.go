package enginecall

import (
	"context"
	"io"
	"net/url"
	"testing"
)

func TestOverloaded(t *testing.T) {
	for status, want := range map[int]bool{200: false, 400: false, 404: false, 500: false, 429: true, 502: true, 503: true, 504: true} {
		if got := Overloaded(status); got != want {
			t.Errorf("Overloaded(%d) = %v, want %v", status, got, want)
		}
	}
}

func TestNewRequestCanBeSentTwice(t *testing.T) {
	u, _ := url.Parse("http://10.0.0.7:8000/v1/chat/completions")
	req := NewRequest(context.Background(), u, []byte(`{"model":"m"}`))
	if req.Method != "POST" || req.Host != "10.0.0.7:8000" || req.Header.Get("Content-Type") != "application/json" || req.ContentLength != 13 {
		t.Fatalf("request %s %s host %q type %q length %d", req.Method, req.URL, req.Host, req.Header.Get("Content-Type"), req.ContentLength)
	}
	// The transport replays the body on a retried connection.
	for range 2 {
		body, err := req.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(body); string(b) != `{"model":"m"}` {
			t.Fatalf("body %q", b)
		}
	}
}
