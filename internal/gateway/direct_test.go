package gateway

import (
	"testing"
	"time"
)

func TestDecideLane(t *testing.T) {
	now := time.Unix(1000, 0)
	on := laneState{enabled: true, serving: true, now: now}
	with := func(f func(*laneState)) laneState { s := on; f(&s); return s }
	for _, c := range []struct {
		name string
		s    laneState
		want laneAction
	}{
		{"off by the field", laneState{serving: true, held: true, now: now}, laneTakeQueue},
		{"no lease: ask, take the queue", on, laneAskLease},
		{"no lease, already asking", with(func(s *laneState) { s.asking = true }), laneTakeQueue},
		{"no lease, backing off", with(func(s *laneState) { s.retryAfter = now.Add(time.Second) }), laneTakeQueue},
		{"backing off ended", with(func(s *laneState) { s.retryAfter = now }), laneAskLease},
		{"free lease", with(func(s *laneState) { s.held = true }), laneTakeDirect},
		{"lease busy: overflow takes the queue", with(func(s *laneState) { s.held, s.busy = true, true }), laneTakeQueue},
		{"lease expired", with(func(s *laneState) { s.held, s.expired = true, true }), laneDropLease},
		{"lease revoked", with(func(s *laneState) { s.held, s.revoked = true, true }), laneDropLease},
		{"not serving: give the lease back", with(func(s *laneState) { s.held, s.serving = true, false }), laneDropLease},
		{"not serving, no lease: no ask", with(func(s *laneState) { s.serving = false }), laneTakeQueue},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decideLane(c.s); got != c.want {
				t.Errorf("decideLane(%+v) = %v, want %v", c.s, got, c.want)
			}
		})
	}
}
