package helmreconciler

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/postrender"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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

// start reads path (an object's URL path) in the background.
func (p *prefetcher) start(ctx context.Context, path string) {
	path = strings.TrimSuffix(p.base.Path, "/") + path
	p.mu.Lock()
	now := time.Now()
	for k, f := range p.fetches {
		if now.Sub(f.started) > prefetchTTL {
			delete(p.fetches, k)
		}
	}
	if _, ok := p.fetches[path]; ok {
		p.mu.Unlock()
		return
	}
	f := &fetch{done: make(chan struct{}), started: now}
	p.fetches[path] = f
	p.mu.Unlock()

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
		var b strings.Builder
		if gvk.Group == "" {
			b.WriteString("/api/" + gvk.Version)
		} else {
			b.WriteString("/apis/" + gvk.Group + "/" + gvk.Version)
		}
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = pr.namespace
			}
			b.WriteString("/namespaces/" + ns)
		}
		b.WriteString("/" + m.Resource.Resource + "/" + o.GetName())
		pr.p.start(pr.ctx, b.String())
	}
}
