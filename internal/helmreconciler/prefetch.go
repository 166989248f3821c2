package helmreconciler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/postrender"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/model-orchestra/operator/internal/render"
)

// Before Helm creates a release's objects it reads each of them, one after
// the other (install: the check that none exists outside the release;
// upgrade: whether to create or patch it), which makes an install of N
// objects N serial round trips. The prefetcher starts these reads at
// once, as soon as the manifest is rendered, and answers Helm's reads with
// their responses: the same requests and answers, in one round trip.
//
// On an install, an object that the operator's cache (which watches its
// kind) does not hold is not read at all: its read is answered with the
// API server's 404, from the cache's knowledge (see
// Reconciler.cachedAbsent for why that is safe).
//
// It sits in the transport of Helm's REST config, above authentication,
// and serves only a GET of exactly a prefetched path, once, and only a
// response at most prefetchTTL old; anything else goes to the API server.

const prefetchTTL = 5 * time.Second

type prefetcher struct {
	client *http.Client
	base   *url.URL

	mu      sync.Mutex
	fetches map[string]*fetch // by URL path
}

type fetch struct {
	done    chan struct{}
	started time.Time
	resp    *http.Response // body already read into body
	body    []byte
	err     error
}

func newPrefetcher(cfg *rest.Config) (*prefetcher, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the prefetch client: %w", err)
	}
	base, err := url.Parse(cfg.Host)
	if err != nil || base.Host == "" {
		base, err = url.Parse("https://" + cfg.Host)
		if err != nil {
			return nil, fmt.Errorf("parsing the API server address %q: %w", cfg.Host, err)
		}
	}
	return &prefetcher{client: hc, base: base, fetches: map[string]*fetch{}}, nil
}

// wrap is the transport wrapper of Helm's REST config.
func (p *prefetcher) wrap(rt http.RoundTripper) http.RoundTripper {
	return prefetchTransport{p: p, next: rt}
}

// add registers f as the answer to the next GET of path (an object's URL
// path, without the base's prefix) and returns the full path. It returns
// false, and registers nothing, if path already has one.
func (p *prefetcher) add(path string, f *fetch) (string, bool) {
	path = strings.TrimSuffix(p.base.Path, "/") + path
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, g := range p.fetches {
		if f.started.Sub(g.started) > prefetchTTL {
			delete(p.fetches, k)
		}
	}
	if _, ok := p.fetches[path]; ok {
		return path, false
	}
	p.fetches[path] = f
	return path, true
}

// absent answers the next GET of path (an object's URL path) with the API
// server's 404 for the object, without a request: the operator's cache
// shows that no such object exists (see Reconciler.cachedAbsent).
// resource is the object's resource (plural) and name its name, for the
// Status body.
func (p *prefetcher) absent(path, resource, name string) {
	body, _ := json.Marshal(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound,
		Message: fmt.Sprintf("%s %q not found", resource, name),
		Details: &metav1.StatusDetails{Name: name, Kind: resource},
	})
	done := make(chan struct{})
	close(done)
	p.add(path, &fetch{
		done: done, started: time.Now(), body: body,
		resp: &http.Response{
			Status: "404 Not Found", StatusCode: http.StatusNotFound, Proto: "HTTP/2.0", ProtoMajor: 2,
			Header: http.Header{"Content-Type": []string{"application/json"}},
		},
	})
}

// start reads path (an object's URL path) in the background.
func (p *prefetcher) start(ctx context.Context, path string) {
	f := &fetch{done: make(chan struct{}), started: time.Now()}
	path, ok := p.add(path, f)
	if !ok {
		return
	}

	u := *p.base
	u.Path = path
	go func() {
		defer close(f.done)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			f.err = err
			return
		}
		req.Header.Set("Accept", "application/json")
		resp, err := p.client.Do(req)
		if err != nil {
			f.err = err
			return
		}
		defer func() { _ = resp.Body.Close() }()
		f.body, f.err = io.ReadAll(resp.Body)
		f.resp = resp
	}()
}

// take returns the prefetched answer to req, or nil.
func (p *prefetcher) take(req *http.Request) *http.Response {
	if req.Method != http.MethodGet || req.URL.RawQuery != "" {
		return nil
	}
	p.mu.Lock()
	f, ok := p.fetches[req.URL.Path]
	if ok {
		delete(p.fetches, req.URL.Path)
	}
	p.mu.Unlock()
	if !ok {
		return nil
	}
	select {
	case <-f.done:
	case <-req.Context().Done():
		return nil
	}
	if f.err != nil || f.resp == nil || time.Since(f.started) > prefetchTTL {
		return nil
	}
	if a := req.Header.Get("Accept"); a != "" && !strings.Contains(a, "application/json") {
		return nil
	}
	return &http.Response{
		Status: f.resp.Status, StatusCode: f.resp.StatusCode, Proto: f.resp.Proto, ProtoMajor: f.resp.ProtoMajor, ProtoMinor: f.resp.ProtoMinor,
		Header: f.resp.Header.Clone(), Body: io.NopCloser(bytes.NewReader(f.body)), ContentLength: int64(len(f.body)), Request: req,
	}
}

type prefetchTransport struct {
	p    *prefetcher
	next http.RoundTripper
}

func (t prefetchTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if resp := t.p.take(req); resp != nil {
		return resp, nil
	}
	return t.next.RoundTrip(req)
}

// prefetchingPostRenderer starts reading the objects of the rendered
// manifest from the API server as it hands the manifest to Helm.
type prefetchingPostRenderer struct {
	postrender.PostRenderer
	p         *prefetcher
	ctx       context.Context
	mapper    meta.RESTMapper
	namespace string                       // the release's
	objs      []*unstructured.Unstructured // the output of the last Run
	// absent, when set, says an object is known not to exist; its read is
	// then answered 404 without a request (installs only: see
	// Reconciler.cachedAbsent).
	absent func(ctx context.Context, gvk schema.GroupVersionKind, namespace, name string) bool
}

// Objects returns the objects of the manifest the last Run returned (see
// renderedObjects).
func (pr *prefetchingPostRenderer) Objects() []*unstructured.Unstructured { return pr.objs }

// renderedObjects returns the objects of out, the manifest pr.Run just
// returned: those pr kept, when it keeps them (the engine's chain parses
// and changes the objects, so parsing its output again is wasted work),
// else out parsed. The caller must not change them.
func renderedObjects(pr postrender.PostRenderer, out *bytes.Buffer) ([]*unstructured.Unstructured, error) {
	if r, ok := pr.(interface {
		Objects() []*unstructured.Unstructured
	}); ok {
		if objs := r.Objects(); objs != nil {
			return objs, nil
		}
	}
	return render.ParseManifest(out.String())
}

func (pr *prefetchingPostRenderer) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	out, err := pr.PostRenderer.Run(in)
	if err != nil {
		return nil, err
	}
	// A manifest that does not parse is Helm's to report.
	if objs, perr := renderedObjects(pr.PostRenderer, out); perr == nil {
		pr.objs = objs
		pr.prefetch(objs)
	}
	return out, nil
}

// prefetch starts reading objs from the API server.
func (pr *prefetchingPostRenderer) prefetch(objs []*unstructured.Unstructured) {
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := pr.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil || o.GetName() == "" {
			continue
		}
		ns := ""
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if ns = o.GetNamespace(); ns == "" {
				ns = pr.namespace
			}
		}
		var b strings.Builder
		if gvk.Group == "" {
			b.WriteString("/api/" + gvk.Version)
		} else {
			b.WriteString("/apis/" + gvk.Group + "/" + gvk.Version)
		}
		if ns != "" {
			b.WriteString("/namespaces/" + ns)
		}
		b.WriteString("/" + m.Resource.Resource + "/" + o.GetName())
		if pr.absent != nil && pr.absent(pr.ctx, gvk, ns, o.GetName()) {
			pr.p.absent(b.String(), m.Resource.Resource, o.GetName())
			continue
		}
		pr.p.start(pr.ctx, b.String())
	}
}
