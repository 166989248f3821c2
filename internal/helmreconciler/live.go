package helmreconciler

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"

	"helm.sh/helm/v3/pkg/postrender"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/model-orchestra/operator/internal/plugin"
)

// liveInputs tracks the live objects that the entry's post-renderers read
// (plugin.DigestContributor): it reads their metadata from caches of its
// own, one per namespace, started when a resource of that namespace first
// names one (the operator's main cache holds only objects labelled
// managed-by Helm, and a user's Secret is not), and it maps an event on one
// of them to the resources that read it.
type liveInputs struct {
	// started is closed once ctx, the manager's context, is set.
	started chan struct{}
	ctx     context.Context

	cacheMu sync.Mutex                                  // held while a cache starts; events do not wait for it
	caches  map[string]cache.Cache                      // by namespace
	watched map[string]map[schema.GroupVersionKind]bool // by namespace

	mu     sync.Mutex
	readBy map[plugin.ObjectRef]map[types.NamespacedName]bool // object -> resources
	reads  map[types.NamespacedName][]plugin.ObjectRef        // resource -> objects
}

func newLiveInputs() *liveInputs {
	return &liveInputs{
		started: make(chan struct{}),
		caches:  map[string]cache.Cache{},
		watched: map[string]map[schema.GroupVersionKind]bool{},
		readBy:  map[plugin.ObjectRef]map[types.NamespacedName]bool{},
		reads:   map[types.NamespacedName][]plugin.ObjectRef{},
	}
}

// Start implements manager.Runnable: it gives the caches the manager's
// lifetime.
func (l *liveInputs) Start(ctx context.Context) error {
	l.ctx = ctx
	close(l.started)
	<-ctx.Done()
	return nil
}

// contributors returns the entry's post-renderers that name live inputs.
func (r *Reconciler) contributors() []contributor {
	var out []contributor
	for _, pr := range r.entry.PostRenderers {
		if c, ok := pr.Renderer.(plugin.DigestContributor); ok {
			out = append(out, contributor{name: pr.Name, c: c})
		}
	}
	return out
}

type contributor struct {
	name string
	c    plugin.DigestContributor
}

// liveDigest returns the digest of the inputs of obj: base (render.Inputs'
// digest) extended with the resourceVersions of the live objects that the
// post-renderers name for objs, their output. Without such objects it is
// base, so that entries without contributors keep their digests. It
// records which objects obj reads, and watches them.
func (r *Reconciler) liveDigest(ctx context.Context, obj *unstructured.Unstructured, base string, objs []*unstructured.Unstructured) (string, error) {
	rc := plugin.RenderContext{Owner: obj.DeepCopy()}
	var b bytes.Buffer
	var all []plugin.ObjectRef
	for _, pr := range r.contributors() {
		refs, err := pr.c.DigestInputs(ctx, rc, objs)
		if err != nil {
			return "", fmt.Errorf("post-renderer %q: naming its live inputs: %w", pr.name, err)
		}
		refs = sortedRefs(refs)
		for _, ref := range refs {
			rv, err := r.live.resourceVersion(ctx, r, ref)
			if err != nil {
				return "", fmt.Errorf("post-renderer %q: reading %s %s/%s: %w", pr.name, ref.GVK.Kind, ref.Namespace, ref.Name, err)
			}
			fmt.Fprintf(&b, "%s\x00%s\x00%s\x00%s\x00%s\n", pr.name, ref.GVK, ref.Namespace, ref.Name, rv)
		}
		all = append(all, refs...)
	}
	r.live.record(types.NamespacedName{Namespace: obj.GetNamespace(), Name: obj.GetName()}, all)
	if b.Len() == 0 {
		return base, nil
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\n", base)
	h.Write(b.Bytes())
	return hex.EncodeToString(h.Sum(nil)[:16]), nil
}

func sortedRefs(refs []plugin.ObjectRef) []plugin.ObjectRef {
	out := append([]plugin.ObjectRef(nil), refs...)
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GVK != b.GVK {
			return a.GVK.String() < b.GVK.String()
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
	return out
}

// record replaces the objects that owner reads.
func (l *liveInputs) record(owner types.NamespacedName, refs []plugin.ObjectRef) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ref := range l.reads[owner] {
		delete(l.readBy[ref], owner)
		if len(l.readBy[ref]) == 0 {
			delete(l.readBy, ref)
		}
	}
	if len(refs) == 0 {
		delete(l.reads, owner)
		return
	}
	l.reads[owner] = refs
	for _, ref := range refs {
		if l.readBy[ref] == nil {
			l.readBy[ref] = map[types.NamespacedName]bool{}
		}
		l.readBy[ref][owner] = true
	}
}

// forget drops owner (deleted or no longer served).
func (l *liveInputs) forget(owner types.NamespacedName) { l.record(owner, nil) }

// readers are the resources that read ref.
func (l *liveInputs) readers(ref plugin.ObjectRef) []reconcile.Request {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]reconcile.Request, 0, len(l.readBy[ref]))
	for o := range l.readBy[ref] {
		out = append(out, reconcile.Request{NamespacedName: o})
	}
	return out
}

// resourceVersion reads ref's resourceVersion from the namespace's cache
// ("absent" when it does not exist), starting the cache and the watch of
// the kind on first use.
func (l *liveInputs) resourceVersion(ctx context.Context, r *Reconciler, ref plugin.ObjectRef) (string, error) {
	c, err := l.watch(ctx, r, ref.Namespace, ref.GVK)
	if err != nil {
		return "", err
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(ref.GVK)
	if err := c.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, m); err != nil {
		if apierrors.IsNotFound(err) {
			return "absent", nil
		}
		return "", err
	}
	return m.GetResourceVersion(), nil
}

// watch returns the cache of ns, started and watching gvk (metadata only),
// with events mapped to the resources that read the object.
func (l *liveInputs) watch(ctx context.Context, r *Reconciler, ns string, gvk schema.GroupVersionKind) (cache.Cache, error) {
	select {
	case <-l.started:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	l.cacheMu.Lock()
	defer l.cacheMu.Unlock()
	c := l.caches[ns]
	if c == nil {
		var err error
		c, err = cache.New(r.restConfig, cache.Options{
			Scheme:            r.scheme,
			Mapper:            r.mapper,
			DefaultNamespaces: map[string]cache.Config{ns: {}},
			DefaultTransform:  StripManagedFields(),
		})
		if err != nil {
			return nil, fmt.Errorf("building the cache of live inputs in namespace %s: %w", ns, err)
		}
		go func() {
			if err := c.Start(l.ctx); err != nil {
				ctrl.Log.WithName(controllerName(r.entry)).Error(err, "cache of live inputs stopped", "namespace", ns)
			}
		}()
		// Kept even if the wait below is cut short: the next reconcile
		// waits for the same cache.
		l.caches[ns] = c
		l.watched[ns] = map[schema.GroupVersionKind]bool{}
	}
	if !l.watched[ns][gvk] {
		if !c.WaitForCacheSync(ctx) {
			return nil, fmt.Errorf("cache of live inputs in namespace %s did not start", ns)
		}
		m := &metav1.PartialObjectMetadata{}
		m.SetGroupVersionKind(gvk)
		// Blocks until the informer has synced, so that reads see the
		// namespace's objects.
		if _, err := c.GetInformer(ctx, m); err != nil {
			return nil, fmt.Errorf("watching %s in namespace %s: %w", gvk.Kind, ns, err)
		}
		src := source.Kind(c, m, handler.TypedEnqueueRequestsFromMapFunc(func(_ context.Context, o *metav1.PartialObjectMetadata) []reconcile.Request {
			return l.readers(plugin.ObjectRef{GVK: gvk, Namespace: o.GetNamespace(), Name: o.GetName()})
		}))
		if err := r.ctrl.Watch(src); err != nil {
			return nil, fmt.Errorf("watching %s in namespace %s: %w", gvk.Kind, ns, err)
		}
		l.watched[ns][gvk] = true
	}
	return c, nil
}

// digestingPostRenderer runs the render pipeline and then sets the digest
// label of the release being written to the digest of what it rendered:
// the live inputs are those the post-renderers name for this output, read
// at render time. Helm builds the stored release's labels from the map
// after rendering.
type digestingPostRenderer struct {
	postrender.PostRenderer
	r      *Reconciler
	ctx    context.Context
	obj    *unstructured.Unstructured
	base   string
	labels map[string]string
	objs   []*unstructured.Unstructured // the output of the last Run
}

// Objects returns the objects of the manifest the last Run returned (see
// renderedObjects).
func (p *digestingPostRenderer) Objects() []*unstructured.Unstructured { return p.objs }

func (p *digestingPostRenderer) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	out, err := p.PostRenderer.Run(in)
	if err != nil {
		return nil, err
	}
	objs, err := renderedObjects(p.PostRenderer, out)
	if err != nil {
		return nil, err
	}
	p.objs = objs
	d, err := p.r.liveDigest(p.ctx, p.obj, p.base, objs)
	if err != nil {
		return nil, err
	}
	p.labels[LabelDigest] = d
	return out, nil
}
