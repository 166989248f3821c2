package dispatch

import (
	"container/list"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/zeebo/xxh3"
)

// Routing policies: how a request's engine root is chosen among those
// with a free slot.
const (
	// RouteLeastLoaded sends a request to the root with the fewest
	// requests in flight (from this dispatcher).
	RouteLeastLoaded = "leastLoaded"
	// RoutePrefix sends a request to the root it most recently sent the
	// longest prefix of the prompt to (whose engine most likely still has
	// it in its prefix cache), unless that root's load exceeds the bound
	// (see Routing.LoadFactor); otherwise to the least loaded.
	RoutePrefix = "prefix"
	// RouteConsistentHash is consistent hashing with bounded loads
	// (CHWBL, as KubeAI's PrefixHash): the first PrefixChars characters
	// of the first user message pick a point on a hash ring, and the
	// request goes to the first root clockwise whose load is within the
	// bound. A peer policy, kept for comparison.
	RouteConsistentHash = "consistentHash"
	// RouteRandom picks a root with a free slot at random. A peer policy,
	// kept for comparison.
	RouteRandom = "random"
)

// Routing chooses an application's engine root per request.
type Routing struct {
	// Policy is leastLoaded (the default), prefix, consistentHash or
	// random.
	Policy string `json:"policy,omitempty"`
	// LoadFactor bounds the load of the root a request prefers (prefix,
	// consistentHash): it is taken while its requests in flight, this one
	// included, stay within LoadFactor times the mean over the roots
	// (rounded up). Default 1.25.
	LoadFactor float64 `json:"loadFactor,omitempty"`
	// LoadCost is what a request in flight on a root costs a request sent
	// there, in prompt blocks (prefix): a root is chosen for the blocks it
	// would prefill plus LoadCost per request in flight. Default (0): half
	// the moving mean of the blocks routed requests had to prefill where
	// they went, learnt from this dispatcher's decisions.
	LoadCost float64 `json:"loadCost,omitempty"`
	// BlockBytes is the size of the blocks the rendered prompt is hashed
	// in (prefix). Default 64, about the 16 tokens of a vLLM block.
	BlockBytes int `json:"blockBytes,omitempty"`
	// IndexBlocks is how many blocks the dispatcher remembers per root,
	// least recently sent forgotten first (prefix). Default 16384: 1 MiB
	// of prompt text, about 256k tokens, per root.
	IndexBlocks int `json:"indexBlocks,omitempty"`
	// PrefixChars is how many characters of the first user message
	// consistentHash hashes. Default 100.
	PrefixChars int `json:"prefixChars,omitempty"`
	// Share publishes each prefix decision to the other dispatchers of
	// the orchestra (core NATS), so that each knows where the others sent
	// which prefixes. Default true.
	Share *bool `json:"share,omitempty"`
	// Observe, when set, is told of every decision (benchmarks). It runs
	// on the application's dispatch loop: it must return quickly and must
	// not keep the event's Body.
	Observe func(RouteEvent) `json:"-"`
}

// RouteEvent is one routing decision, as Routing.Observe sees it.
type RouteEvent struct {
	// Dispatcher is the deciding dispatcher's id.
	Dispatcher string
	// Body is the request's body as the dispatcher read it.
	Body []byte
	// Root is the chosen root; Outcome is hit, miss or overflow.
	Root, Outcome string
	// Match is the chosen root's matched prompt blocks (prefix); Best the
	// longest match over the roots.
	Match, Best int
	// Bound is the load bound (prefix, consistentHash).
	Bound int
	// Roots is every candidate root as the decision saw it.
	Roots []RouteCandidate
}

// RouteCandidate is one root as a decision saw it.
type RouteCandidate struct {
	Root  string
	Load  int
	Free  bool
	Match int
}

// defaultRouting fills a routing's unset fields.
func defaultRouting(r Routing) Routing {
	if r.Policy == "" {
		r.Policy = RouteLeastLoaded
	}
	if r.LoadFactor == 0 {
		r.LoadFactor = 1.25
	}
	if r.BlockBytes == 0 {
		r.BlockBytes = 64
	}
	if r.IndexBlocks == 0 {
		r.IndexBlocks = 16384
	}
	if r.PrefixChars == 0 {
		r.PrefixChars = 100
	}
	if r.Share == nil {
		share := true
		r.Share = &share
	}
	return r
}

// validate reports a routing's invalid fields.
func (r Routing) validate() error {
	var errs []string
	switch r.Policy {
	case "", RouteLeastLoaded, RoutePrefix, RouteConsistentHash, RouteRandom:
	default:
		errs = append(errs, fmt.Sprintf("policy %q is not one of %s, %s, %s, %s", r.Policy, RouteLeastLoaded, RoutePrefix, RouteConsistentHash, RouteRandom))
	}
	if r.LoadFactor != 0 && r.LoadFactor < 1 {
		errs = append(errs, fmt.Sprintf("loadFactor %v must be at least 1", r.LoadFactor))
	}
	if r.BlockBytes < 0 || r.IndexBlocks < 0 || r.PrefixChars < 0 || r.LoadCost < 0 {
		errs = append(errs, "blockBytes, indexBlocks, prefixChars and loadCost must not be negative")
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// prompt is what routing reads of a request: its prompt rendered as one
// text, and the routing key of consistent hashing.
type prompt struct {
	text string
	// key is the first characters of the first user message (or of the
	// prompt); "" when there is none.
	key string
}

// parsePrompt renders a chat or completion request's prompt. The chat
// template is approximated: each message as "<|role|>\n" content
// "<|end|>\n", in order. Engines render their own template, but what
// routing needs is only that equal prefixes render equally, and they do.
// A body it cannot read has an empty prompt (it is routed as a miss).
func parsePrompt(body []byte, prefixChars int) prompt {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
		Prompt json.RawMessage `json:"prompt"`
	}
	if json.Unmarshal(body, &req) != nil {
		return prompt{}
	}
	var b strings.Builder
	var p prompt
	for _, m := range req.Messages {
		text := contentText(m.Content)
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(text)
		b.WriteString("<|end|>\n")
		if p.key == "" && m.Role == "user" {
			p.key = firstChars(text, prefixChars)
		}
	}
	if len(req.Messages) == 0 && len(req.Prompt) > 0 {
		var s string
		var ss []string
		switch {
		case json.Unmarshal(req.Prompt, &s) == nil:
		case json.Unmarshal(req.Prompt, &ss) == nil && len(ss) > 0:
			s = ss[0]
		default:
			s = string(req.Prompt) // token ids: their JSON is as good a text
		}
		b.WriteString(s)
		p.key = firstChars(s, prefixChars)
	}
	p.text = b.String()
	return p
}

// contentText is a message's content: a string, or the text of its parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) != nil {
		return string(raw)
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func firstChars(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

// blockHashes cuts text into blocks of size bytes and hashes each block
// together with the hash before it, as engines hash their KV-cache blocks:
// a block's hash names the whole prefix up to its end. A trailing partial
// block is not hashed (engines cache whole blocks only).
func blockHashes(text string, size int) []uint64 {
	out := make([]uint64, 0, len(text)/size)
	var buf []byte
	var parent uint64
	for i := 0; i+size <= len(text); i += size {
		buf = binary.LittleEndian.AppendUint64(buf[:0], parent)
		buf = append(buf, text[i:i+size]...)
		parent = xxh3.Hash(buf)
		out = append(out, parent)
	}
	return out
}

// rootIndex is the blocks recently sent to one root, least recent
// forgotten first. Blocks are recorded last to first, so that what is
// forgotten first is the end of a prefix and what is left still forms
// prefixes (as engines evict).
type rootIndex struct {
	max int
	lru *list.List // of uint64, most recent first
	at  map[uint64]*list.Element
}

func newRootIndex(maxBlocks int) *rootIndex {
	return &rootIndex{max: maxBlocks, lru: list.New(), at: map[uint64]*list.Element{}}
}

// match is how many leading blocks of hashes were sent to the root.
func (x *rootIndex) match(hashes []uint64) int {
	n := 0
	for n < len(hashes) {
		if _, ok := x.at[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// record remembers that hashes were sent to the root.
func (x *rootIndex) record(hashes []uint64) {
	for i := len(hashes) - 1; i >= 0; i-- {
		if e, ok := x.at[hashes[i]]; ok {
			x.lru.MoveToFront(e)
			continue
		}
		x.at[hashes[i]] = x.lru.PushFront(hashes[i])
	}
	for x.lru.Len() > x.max {
		e := x.lru.Back()
		delete(x.at, e.Value.(uint64))
		x.lru.Remove(e)
	}
}

// Outcomes of a routing decision.
const (
	// outcomeHit: the request went to a root its longest recently-sent
	// prefix went to.
	outcomeHit = "hit"
	// outcomeMiss: no root had any of its prefix; it went to the least
	// loaded.
	outcomeMiss = "miss"
	// outcomeOverflow: the root with its longest prefix was over the load
	// bound (or had no free slot); it went elsewhere.
	outcomeOverflow = "overflow"
)

// candidate is one root as a decision sees it.
type candidate struct {
	root string
	// load is the requests this dispatcher has in flight on the root.
	load int
	// free: the root can take a request now (a free slot, not ejected).
	// Roots that are not free still count in the mean load.
	free bool
	// match is the number of leading prompt blocks recently sent there.
	match int
}

// decision is where a request goes: root "" when no root is free.
type decision struct {
	root    string
	outcome string
	match   int
	// best and bound are the longest match and the load bound, for
	// Routing.Observe.
	best, bound int
}

// loadBound is the most requests in flight a root may have, the new one
// included, to take a request it is preferred for: factor times the mean
// over the roots after the request, rounded up (CHWBL).
func loadBound(cands []candidate, factor float64) int {
	if len(cands) == 0 {
		return 0
	}
	total := 1
	for _, c := range cands {
		total += c.load
	}
	return int(math.Ceil(factor * float64(total) / float64(len(cands))))
}

// decidePrefix picks the root for a request of blocks prompt blocks whose
// per-root matches are in cands (RoutePrefix): the free root with the
// lowest cost, the blocks it would have to prefill (not matched there)
// plus loadCost blocks per request in flight there (the wait behind
// them), ties to the least loaded, then to the root the request's own
// hash ranks highest (rendezvous hashing, so that dispatchers that see
// the same loads agree). A root over the load bound (factor times the
// mean, rounded up, plus one: so that at a few requests in flight one
// more than a root's share is not over it) is not a candidate, unless it
// is the least loaded. The bound guards against a long shared prefix
// piling its requests on one root; below it, the cost decides.
func decidePrefix(cands []candidate, blocks int, factor, loadCost float64, tie uint64) decision {
	bound := loadBound(cands, factor) + 1
	best := 0
	for _, c := range cands {
		best = max(best, c.match)
	}
	least := leastLoaded(cands, tie)
	if least == nil {
		return decision{}
	}
	cost := func(c *candidate) float64 { return float64(blocks-c.match) + loadCost*float64(c.load) }
	pick := least
	for i := range cands {
		c := &cands[i]
		if !c.free || c.load+1 > bound {
			continue
		}
		cc, cp := cost(c), cost(pick)
		if cc < cp || (cc == cp && (c.load < pick.load || (c.load == pick.load && rank(tie, c.root) > rank(tie, pick.root)))) {
			pick = c
		}
	}
	d := decision{root: pick.root, match: pick.match, outcome: outcomeHit, best: best, bound: bound}
	switch {
	case best == 0:
		d.outcome = outcomeMiss
	case pick.match < best:
		d.outcome = outcomeOverflow
	}
	return d
}

// loadCostAlpha is the weight of a new decision in the moving mean of the
// blocks each routed request had to prefill.
const loadCostAlpha = 1.0 / 32

// nextMeanPrefill updates the moving mean of the blocks routed requests
// had to prefill where they went; the first decision sets it.
func nextMeanPrefill(mean float64, n int, uncached int) float64 {
	if n == 0 {
		return float64(uncached)
	}
	return mean + loadCostAlpha*(float64(uncached)-mean)
}

// learntLoadCost is what a request in flight costs the requests sent
// after it, as far as the dispatcher can tell (it does not see a
// request's stage): half the mean blocks routed requests had to prefill,
// since a request in flight is on average halfway through its prefill,
// or past it and decoding, which delays the next prefill little.
func learntLoadCost(meanPrefill float64) float64 { return meanPrefill / 2 }

// leastLoaded is the free root with the fewest requests in flight, ties
// broken by rendezvous hashing on tie; nil when none is free.
func leastLoaded(cands []candidate, tie uint64) *candidate {
	var pick *candidate
	for i := range cands {
		c := &cands[i]
		if c.free && (pick == nil || c.load < pick.load || (c.load == pick.load && rank(tie, c.root) > rank(tie, pick.root))) {
			pick = c
		}
	}
	return pick
}

// rank is root's rendezvous-hashing weight for key.
func rank(key uint64, root string) uint64 {
	return xxh3.HashStringSeed(root, key)
}

// ringReplicas is the number of points per root on the consistent-hashing
// ring (KubeAI's default replication).
const ringReplicas = 256

// ring is a consistent-hashing ring of roots.
type ring struct {
	roots  []string // sorted: the ring's identity
	points []ringPoint
}

type ringPoint struct {
	hash uint64
	root string
}

func newRing(roots []string) *ring {
	r := &ring{roots: slices.Sorted(slices.Values(roots))}
	for _, root := range r.roots {
		for i := range ringReplicas {
			r.points = append(r.points, ringPoint{hash: xxh3.HashString(root + "#" + strconv.Itoa(i)), root: root})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return strings.Compare(a.root, b.root)
	})
	return r
}

// order lists the roots clockwise from key's point, each once.
func (r *ring) order(key uint64) []string {
	i, _ := slices.BinarySearchFunc(r.points, key, func(p ringPoint, k uint64) int {
		switch {
		case p.hash < k:
			return -1
		case p.hash > k:
			return 1
		}
		return 0
	})
	out := make([]string, 0, len(r.roots))
	seen := map[string]bool{}
	for j := range r.points {
		p := r.points[(i+j)%len(r.points)]
		if !seen[p.root] {
			seen[p.root] = true
			out = append(out, p.root)
			if len(out) == len(r.roots) {
				break
			}
		}
	}
	return out
}

// decideConsistent picks the first root in ring order that is free and
// within the load bound (CHWBL); the least loaded free root when none is.
// order lists the roots clockwise from the request's key.
func decideConsistent(cands []candidate, order []string, factor float64, tie uint64) decision {
	bound := loadBound(cands, factor)
	by := make(map[string]*candidate, len(cands))
	for i := range cands {
		by[cands[i].root] = &cands[i]
	}
	for i, root := range order {
		c := by[root]
		if c == nil || !c.free || c.load+1 > bound {
			continue
		}
		d := decision{root: root, outcome: outcomeHit, bound: bound}
		if i > 0 {
			d.outcome = outcomeOverflow
		}
		return d
	}
	if c := leastLoaded(cands, tie); c != nil {
		return decision{root: c.root, outcome: outcomeOverflow, bound: bound}
	}
	return decision{}
}
