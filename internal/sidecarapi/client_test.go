package sidecarapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestClientErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sleep":
			w.WriteHeader(http.StatusConflict)
			_, _ = w.Write([]byte(`{"error":{"message":"sleep abandoned: a wake arrived while draining","code":409}}`))
		default:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"error":{"message":"simulator wake: boom","code":500}}`))
		}
	}))
	defer srv.Close()
	s := Client{URL: srv.URL}
	err := s.Sleep(context.Background(), 1)
	if !errors.Is(err, ErrConflict) || err.Error() != "sidecar sleep: answered 409: sleep abandoned: a wake arrived while draining" {
		t.Errorf("sleep: %v, want a conflict with the sidecar's message", err)
	}
	err = s.Wake(context.Background())
	if errors.Is(err, ErrConflict) || err == nil || err.Error() != "sidecar wake: answered 500: simulator wake: boom" {
		t.Errorf("wake: %v, want a 500 that is not a conflict", err)
	}
}
