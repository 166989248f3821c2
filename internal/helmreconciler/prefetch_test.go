package helmreconciler

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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

// A read of an object known to be absent is answered with the API server's
// NotFound, once, without a request.
func TestPrefetcherAnswersAKnownAbsentObjectWithoutARequest(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"cm","namespace":"ns"}}`)
	}))
	defer srv.Close()
	cfg := &rest.Config{Host: srv.URL}
	p, err := newPrefetcher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Wrap(p.wrap)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	p.absent("/api/v1/namespaces/ns/configmaps/cm", "configmaps", "cm")
	_, err = cs.CoreV1().ConfigMaps("ns").Get(context.Background(), "cm", metav1.GetOptions{})
	if !apierrors.IsNotFound(err) || err.Error() != `configmaps "cm" not found` {
		t.Errorf("read of a known absent object: %v, want the API server's NotFound", err)
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("server saw %d requests, want none", n)
	}
	// Answered once: the next read goes to the server.
	if _, err := cs.CoreV1().ConfigMaps("ns").Get(context.Background(), "cm", metav1.GetOptions{}); err != nil || hits.Load() != 1 {
		t.Errorf("second read: %v after %d requests, want the server's answer", err, hits.Load())
	}
}
