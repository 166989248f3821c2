package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Keys of a token Secret's data.
const (
	// SecretKeyToken holds the bearer token. Required.
	SecretKeyToken = "token"
	// SecretKeyName names the token in logs and metrics. Default: the
	// Secret's name.
	SecretKeyName = "name"
	// SecretKeyModels is a comma-separated list of served model names the
	// token may use. Absent or empty: every model.
	SecretKeyModels = "models"
	// SecretKeyRequestsPerMinute overrides limits.default.requestsPerMinute.
	SecretKeyRequestsPerMinute = "requestsPerMinute"
	// SecretKeyTokensPerMinute overrides limits.default.tokensPerMinute.
	SecretKeyTokensPerMinute = "tokensPerMinute"
	// SecretKeyMaxConcurrent overrides limits.default.maxConcurrent.
	SecretKeyMaxConcurrent = "maxConcurrent"
	// SecretKeyMaxConcurrentStreams is the deprecated name of
	// SecretKeyMaxConcurrent, still read; a Secret that gives both must
	// give the same value.
	SecretKeyMaxConcurrentStreams = deprecatedMaxConcurrent
)

// SecretTokens is a TokenSource fed by the Kubernetes Secrets that match a
// label selector in one namespace, watched with an informer so that added,
// rotated and deleted tokens take effect as soon as the watch event arrives.
//
// The informer's cache never holds a token: a transform replaces each
// Secret by its token's digest and parsed settings before it is stored.
type SecretTokens struct {
	hasher   *TokenHasher
	selector labels.Selector
	defaults Limits
	logger   *slog.Logger
	informer cache.SharedIndexInformer
	factory  informers.SharedInformerFactory
	synced   func() bool
	mu       sync.Mutex
	onChange func(usable int)        // set by notify
	records  map[string]*tokenRecord // by namespace/name
	index    atomic.Pointer[digestIndex]
}

// tokenRecord is what the informer stores for one Secret.
type tokenRecord struct {
	metav1.ObjectMeta
	digest    Digest
	principal *Principal
	// problem says why the Secret gives no usable token; empty when usable.
	problem string
}

// NewSecretTokens returns a token source for the Secrets in namespace that
// match selector. defaults are the limits of tokens that set none. Call
// Start to begin watching.
func NewSecretTokens(client kubernetes.Interface, namespace, selector string, hasher *TokenHasher, defaults Limits, logger *slog.Logger) (*SecretTokens, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, fmt.Errorf("parsing secret selector %q: %w", selector, err)
	}
	if namespace == "" {
		return nil, errors.New("token secrets need a namespace")
	}
	s := &SecretTokens{
		hasher:   hasher,
		selector: sel,
		defaults: defaults,
		logger:   logger,
		records:  map[string]*tokenRecord{},
	}
	empty := digestIndex{}
	s.index.Store(&empty)

	s.factory = informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel.String() }),
		informers.WithTransform(s.transform),
	)
	s.informer = s.factory.Core().V1().Secrets().Informer()
	reg, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.upsert(obj) },
		UpdateFunc: func(_, obj any) { s.upsert(obj) },
		DeleteFunc: s.remove,
	})
	if err != nil {
		return nil, fmt.Errorf("watching token secrets: %w", err)
	}
	s.synced = reg.HasSynced
	return s, nil
}

// Start begins watching the Secrets until ctx is done.
func (s *SecretTokens) Start(ctx context.Context) {
	s.factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		s.factory.Shutdown()
	}()
}

// WaitForSync blocks until the initial list is loaded or ctx is done, and
// reports whether it is loaded.
func (s *SecretTokens) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), s.synced)
}

// HasSynced implements TokenSource.
func (s *SecretTokens) HasSynced() bool { return s.synced() }

// Authenticate implements TokenSource.
func (s *SecretTokens) Authenticate(token string) (*Principal, bool) {
	return s.index.Load().lookup(s.hasher.Digest(token))
}

// transform turns a Secret into a tokenRecord before the informer stores
// it, so that no token is kept in memory. It is idempotent.
func (s *SecretTokens) transform(obj any) (any, error) {
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return obj, nil
	}
	rec := &tokenRecord{ObjectMeta: metav1.ObjectMeta{
		Name:            sec.Name,
		Namespace:       sec.Namespace,
		UID:             sec.UID,
		ResourceVersion: sec.ResourceVersion,
		Labels:          sec.Labels,
	}}
	rec.digest, rec.principal, rec.problem = s.parseSecret(sec)
	return rec, nil
}

// parseSecret reads a token Secret. It never returns or logs the token.
func (s *SecretTokens) parseSecret(sec *corev1.Secret) (Digest, *Principal, string) {
	if !s.selector.Matches(labels.Set(sec.Labels)) {
		return Digest{}, nil, "labels do not match the selector"
	}
	data := func(key string) string {
		if v, ok := sec.Data[key]; ok {
			return strings.TrimSpace(string(v))
		}
		return strings.TrimSpace(sec.StringData[key])
	}
	token := data(SecretKeyToken)
	if token == "" {
		return Digest{}, nil, fmt.Sprintf("data.%s is missing or empty", SecretKeyToken)
	}
	p := &Principal{Name: data(SecretKeyName), Limits: s.defaults}
	if p.Name == "" {
		p.Name = sec.Name
	}
	if models := data(SecretKeyModels); models != "" {
		p.Models = map[string]bool{}
		for m := range strings.SplitSeq(models, ",") {
			if m = strings.TrimSpace(m); m != "" {
				p.Models[m] = true
			}
		}
	}
	maxConcurrentKey := SecretKeyMaxConcurrent
	switch n, old := data(SecretKeyMaxConcurrent), data(SecretKeyMaxConcurrentStreams); {
	case n != "" && old != "" && n != old:
		return Digest{}, nil, fmt.Sprintf("data.%s and data.%s, its deprecated name, differ: give data.%s only",
			SecretKeyMaxConcurrent, SecretKeyMaxConcurrentStreams, SecretKeyMaxConcurrent)
	case n == "" && old != "":
		maxConcurrentKey = SecretKeyMaxConcurrentStreams
	}
	for key, dst := range map[string]*int{
		SecretKeyRequestsPerMinute: &p.Limits.RequestsPerMinute,
		SecretKeyTokensPerMinute:   &p.Limits.TokensPerMinute,
		maxConcurrentKey:           &p.Limits.MaxConcurrent,
	} {
		v := data(key)
		if v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return Digest{}, nil, fmt.Sprintf("data.%s must be a non-negative integer", key)
		}
		*dst = n
	}
	return s.hasher.Digest(token), p, ""
}

// notify makes f be told the number of usable tokens now and after each
// change.
func (s *SecretTokens) notify(f func(usable int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = f
	f(len(*s.index.Load()))
}

func (s *SecretTokens) upsert(obj any) {
	rec, ok := obj.(*tokenRecord)
	if !ok {
		return
	}
	key := rec.Namespace + "/" + rec.Name
	if rec.problem != "" {
		s.logger.Warn("ignoring token secret", "secret", key, "problem", rec.problem)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records[key] = rec
	s.rebuildLocked()
}

func (s *SecretTokens) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	rec, ok := obj.(*tokenRecord)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.records, rec.Namespace+"/"+rec.Name)
	s.rebuildLocked()
}

// rebuildLocked publishes a new index. When two Secrets hold the same
// token, the one whose name sorts first wins, so the result does not
// depend on event order.
func (s *SecretTokens) rebuildLocked() {
	keys := make([]string, 0, len(s.records))
	for k, rec := range s.records {
		if rec.problem == "" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	idx := make(digestIndex, len(keys))
	for _, k := range keys {
		rec := s.records[k]
		if prev, dup := idx[rec.digest]; dup {
			s.logger.Warn("two token secrets hold the same token; using the first",
				"secret", k, "using", prev.principal.Name)
			continue
		}
		idx[rec.digest] = digestEntry{digest: rec.digest, principal: rec.principal}
	}
	s.index.Store(&idx)
	if s.onChange != nil {
		s.onChange(len(idx))
	}
}
