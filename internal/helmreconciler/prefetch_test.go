package helmreconciler

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"k8s.io/client-go/rest"
)

// A prefetched read answers the next GET of the same path, once, with the
// API server's response; other requests go to the server.
func TestPrefetcherAnswersOneReadOfAPrefetchedPath(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/api/v1/namespaces/ns/configmaps/missing" {
			w.WriteHeader(http.StatusNotFound)
		}
		_, _ = io.WriteString(w, `{"path":"`+r.URL.Path+`"}`)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	p, err := newPrefetcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	helmCfg := rest.CopyConfig(cfg)
	helmCfg.Wrap(p.wrap)
	hc, err := rest.HTTPClientFor(helmCfg)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := hc.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	p.start(context.Background(), "/api/v1/namespaces/ns/configmaps/missing")
	p.start(context.Background(), "/apis/apps/v1/namespaces/ns/deployments/d")
	code, body := get("/api/v1/namespaces/ns/configmaps/missing")
	if code != http.StatusNotFound || body != `{"path":"/api/v1/namespaces/ns/configmaps/missing"}` {
		t.Errorf("prefetched GET = %d %s, want the server's 404 and body", code, body)
	}
	if code, _ := get("/apis/apps/v1/namespaces/ns/deployments/d"); code != http.StatusOK {
		t.Errorf("prefetched GET = %d, want 200", code)
	}
	if n := hits.Load(); n != 2 {
		t.Errorf("server saw %d requests for two prefetched reads, want 2", n)
	}
	// Consumed: the next read goes to the server.
	get("/api/v1/namespaces/ns/configmaps/missing")
	if n := hits.Load(); n != 3 {
		t.Errorf("server saw %d requests, want 3: a prefetch answers one read only", n)
	}
}
