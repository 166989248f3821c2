package gateway

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"hash"
	"net/http"
	"strings"
	"sync"
)

// Principal is who a request is made for: an API token, or the anonymous
// caller.
type Principal struct {
	// Name identifies the token in logs and metrics; it is never the token.
	Name string
	// Models are the served model names the token may use; nil means all.
	Models map[string]bool
	// Limits are the token's limits, defaults already applied.
	Limits Limits
}

// mayUse reports whether the principal may use the model.
func (p *Principal) mayUse(model string) bool {
	return p.Models == nil || p.Models[model]
}

// TokenSource resolves API tokens. Implementations hold tokens only as
// digests (see TokenHasher) and must be safe for concurrent use.
type TokenSource interface {
	// Authenticate returns the principal of a bearer token, or false when
	// the token is unknown or revoked.
	Authenticate(token string) (*Principal, bool)
	// HasSynced reports whether the source has loaded its tokens; the
	// gateway is not ready before.
	HasSynced() bool
}

// Digest is the SHA-256 or HMAC-SHA256 digest of a token.
type Digest [sha256.Size]byte

// TokenHasher digests tokens: HMAC-SHA256 under a key, or plain SHA-256
// without one. A TokenHasher is safe for concurrent use.
type TokenHasher struct {
	key  []byte
	pool sync.Pool
}

// NewTokenHasher returns a hasher; an empty key means plain SHA-256.
func NewTokenHasher(key []byte) *TokenHasher {
	h := &TokenHasher{key: append([]byte(nil), key...)}
	h.pool.New = func() any {
		if len(h.key) == 0 {
			return sha256.New()
		}
		return hmac.New(sha256.New, h.key)
	}
	return h
}

// Digest returns the token's digest.
func (h *TokenHasher) Digest(token string) Digest {
	m := h.pool.Get().(hash.Hash)
	m.Reset()
	_, _ = m.Write([]byte(token))
	var d Digest
	m.Sum(d[:0])
	h.pool.Put(m)
	return d
}

// digestIndex finds principals by token digest. The map lookup is keyed by
// a digest, so its timing reveals nothing usable about the token; the final
// comparison is nevertheless constant-time.
type digestIndex map[Digest]digestEntry

type digestEntry struct {
	digest    Digest
	principal *Principal
}

func (idx digestIndex) lookup(d Digest) (*Principal, bool) {
	e, ok := idx[d]
	if !ok || subtle.ConstantTimeCompare(e.digest[:], d[:]) != 1 {
		return nil, false
	}
	return e.principal, true
}

// StaticTokens is a fixed TokenSource, for tests, local runs and the
// end-to-end test harness.
type StaticTokens struct {
	hasher *TokenHasher
	index  digestIndex
}

// NewStaticTokens returns a source that knows exactly the given tokens.
func NewStaticTokens(hasher *TokenHasher, tokens map[string]*Principal) *StaticTokens {
	idx := make(digestIndex, len(tokens))
	for tok, p := range tokens {
		d := hasher.Digest(tok)
		idx[d] = digestEntry{digest: d, principal: p}
	}
	return &StaticTokens{hasher: hasher, index: idx}
}

// Authenticate implements TokenSource.
func (s *StaticTokens) Authenticate(token string) (*Principal, bool) {
	return s.index.lookup(s.hasher.Digest(token))
}

// HasSynced implements TokenSource; a static source is always synced.
func (s *StaticTokens) HasSynced() bool { return true }

// bearerToken extracts the token of an "Authorization: Bearer" header.
// The scheme is case-insensitive (RFC 7235).
func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	tok := strings.TrimSpace(h[len(prefix):])
	return tok, tok != ""
}
