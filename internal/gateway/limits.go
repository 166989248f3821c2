package gateway

import (
	"math"
	"sync"
	"time"
)

// bucket is a token bucket holding up to one minute's worth of budget and
// refilled continuously. Unlike golang.org/x/time/rate it can go into debt,
// which tokens-per-minute needs: a request's cost is only known from the
// engine's usage once it finished.
type bucket struct {
	mu     sync.Mutex
	level  float64 // budget left; negative while in debt
	last   time.Time
	perMin int // the capacity the level was last computed with
}

// refillLocked brings the level up to now for a budget of perMin per
// minute. A changed limit (a rotated Secret) takes effect at once.
func (b *bucket) refillLocked(now time.Time, perMin int) {
	capacity := float64(perMin)
	if b.last.IsZero() || b.perMin != perMin {
		if b.last.IsZero() {
			b.level = capacity
		}
		b.level = math.Min(b.level, capacity)
		b.perMin = perMin
		b.last = now
		return
	}
	if elapsed := now.Sub(b.last); elapsed > 0 {
		b.level = math.Min(capacity, b.level+elapsed.Minutes()*capacity)
		b.last = now
	}
}

// take spends n if the budget allows it; otherwise it spends nothing and
// says how long until it would.
func (b *bucket) take(now time.Time, perMin int, n float64) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now, perMin)
	if b.level >= n {
		b.level -= n
		return true, 0
	}
	return false, b.waitLocked(n, perMin)
}

// reserve spends n if the budget holds it, or if the budget is full (a
// request larger than a minute's budget is let through alone, into debt);
// otherwise it spends nothing and says how long until it would.
func (b *bucket) reserve(now time.Time, perMin int, n float64) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now, perMin)
	need := math.Min(n, float64(perMin))
	if b.level >= need {
		b.level -= n
		return true, 0
	}
	return false, b.waitLocked(need, perMin)
}

// charge spends n, going into debt if needed.
func (b *bucket) charge(now time.Time, perMin int, n float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refillLocked(now, perMin)
	b.level -= n
}

func (b *bucket) waitLocked(n float64, perMin int) time.Duration {
	missing := n - b.level
	return time.Duration(missing / float64(perMin) * float64(time.Minute))
}

// limiter holds the limit state of every principal, keyed by name, so that
// rotating a token keeps its budget.
type limiter struct {
	now    func() time.Time
	states sync.Map // principal name -> *principalState
}

type principalState struct {
	requests bucket
	tokens   bucket
	mu       sync.Mutex
	streams  int
}

func (l *limiter) state(p *Principal) *principalState {
	if s, ok := l.states.Load(p.Name); ok {
		return s.(*principalState)
	}
	s, _ := l.states.LoadOrStore(p.Name, &principalState{})
	return s.(*principalState)
}

// admission is what admit took from a principal's budgets; release gives
// back or settles it.
type admission struct {
	state *principalState
	// reserved is the tokens taken from the tokens-per-minute budget.
	reserved int
}

// estimateTokens is the most a request can cost: its prompt, estimated at
// one token per 4 bytes of body (more than any tokenizer makes of it), plus
// its completion budget.
func estimateTokens(bodyBytes, maxTokens int) int {
	return bodyBytes/4 + 1 + maxTokens
}

// admit checks the principal's limits for a new request and, when it
// passes, takes one request from its budget, for a stream one concurrent
// stream slot, and cost tokens from its tokens-per-minute budget (reserved
// until release settles them). release must be called when the request
// ends (only when admit returned nil).
func (l *limiter) admit(p *Principal, stream bool, cost int) (admission, error) {
	lim := p.Limits
	if lim.RequestsPerMinute == 0 && lim.TokensPerMinute == 0 && (!stream || lim.MaxConcurrent == 0) {
		return admission{}, nil
	}
	s := l.state(p)
	now := l.now()
	if stream && lim.MaxConcurrent > 0 {
		s.mu.Lock()
		if s.streams >= lim.MaxConcurrent {
			s.mu.Unlock()
			return admission{}, rateLimited(reasonConcurrency, time.Second,
				"Rate limit reached for %s: at most %d concurrent streams. Please try again when a stream ends.",
				p.Name, lim.MaxConcurrent)
		}
		s.streams++
		s.mu.Unlock()
	}
	undoStream := func() {
		if stream && lim.MaxConcurrent > 0 {
			s.endStream()
		}
	}
	if lim.RequestsPerMinute > 0 {
		if ok, wait := s.requests.take(now, lim.RequestsPerMinute, 1); !ok {
			undoStream()
			return admission{}, rateLimited(reasonRequestRate, wait,
				"Rate limit reached for %s: requests per minute limit %d exhausted. Please try again in %s.",
				p.Name, lim.RequestsPerMinute, roundUp(wait))
		}
	}
	a := admission{state: s}
	if lim.TokensPerMinute > 0 {
		ok, wait := s.tokens.reserve(now, lim.TokensPerMinute, float64(cost))
		if !ok {
			undoStream()
			if lim.RequestsPerMinute > 0 {
				s.requests.charge(now, lim.RequestsPerMinute, -1) // not served: give the request back
			}
			return admission{}, rateLimited(reasonTokenRate, wait,
				"Rate limit reached for %s: tokens per minute limit %d exhausted (this request may use up to %d). Please try again in %s.",
				p.Name, lim.TokensPerMinute, cost, roundUp(wait))
		}
		a.reserved = cost
	}
	return a, nil
}

// release ends a request admitted by admit and settles its tokens: spent
// replaces the reservation (refunding the difference, or charging the
// excess when the engine's usage exceeded it).
func (l *limiter) release(a admission, p *Principal, stream bool, spent int) {
	s := a.state
	if s == nil {
		return
	}
	if stream && p.Limits.MaxConcurrent > 0 {
		s.endStream()
	}
	if p.Limits.TokensPerMinute > 0 && spent != a.reserved {
		s.tokens.charge(l.now(), p.Limits.TokensPerMinute, float64(spent-a.reserved))
	}
}

func (s *principalState) endStream() {
	s.mu.Lock()
	s.streams--
	s.mu.Unlock()
}

// roundUp rounds a wait up to whole seconds for messages and Retry-After.
func roundUp(d time.Duration) time.Duration {
	if d <= 0 {
		return time.Second
	}
	return (d + time.Second - 1).Truncate(time.Second)
}
