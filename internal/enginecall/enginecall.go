// Package enginecall is the one owner of how an inference request is sent
// to an engine root: the dispatcher (the queue lane) and the gateway (the
// direct lane) build the engine's HTTP request and read its refusals here,
// so both lanes call engines the same way. The gateway prepares the body
// (served model name, stream_options.include_usage) before either lane
// carries it; the engine path is the OpenAI path every supported engine
// serves (vLLM, llama.cpp, Ollama's OpenAI compatibility, the simulator).
package enginecall

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// jsonContentType is the request Content-Type, shared by all requests
// (the transport only reads it).
var jsonContentType = []string{"application/json"}

// NewRequest builds the POST of body to u, an engine root's URL joined
// with the engine path.
func NewRequest(ctx context.Context, u *url.URL, body []byte) *http.Request {
	req := &http.Request{
		Method:        http.MethodPost,
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": jsonContentType},
		Body:          io.NopCloser(bytes.NewReader(body)),
		GetBody:       func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil },
		ContentLength: int64(len(body)),
		Host:          u.Host,
	}
	return req.WithContext(ctx)
}

// Overloaded reports whether an engine status means the engine could not
// take the request now (busy, restarting, behind a failing proxy): the
// request is retried elsewhere or later, and the root counts a failure.
// Every other status is the engine's answer and is relayed.
func Overloaded(status int) bool {
	switch status {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// NewTransport returns the transport engine requests go through. It is
// used as a RoundTripper, not through an http.Client: engine answers are
// relayed as they are (redirects included).
func NewTransport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
	}
}
