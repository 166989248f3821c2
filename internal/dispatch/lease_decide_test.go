package dispatch

import (
	"testing"
	"time"
)

func TestDecideHeld(t *testing.T) {
	// revoked is a lease taken back (at maxAge or for queued requests).
	revoked := heldState{maxAge: true, revoked: true}
	with := func(s heldState, f func(*heldState)) heldState { f(&s); return s }
	for _, c := range []struct {
		name string
		s    heldState
		want heldAction
	}{
		{"lent, within maxAge: kept", heldState{}, heldKeep},
		{"lent, busy: kept", heldState{busy: true}, heldKeep},
		{"given back: freed", heldState{returned: true}, heldRelease},
		{"given back after the revoke: freed", with(revoked, func(s *heldState) { s.returned, s.busy = true, true }), heldRelease},
		{"dispatcher stops: revoked and freed", heldState{stopping: true}, heldRevokeRelease},
		{"dispatcher stops, busy: revoked and freed (the process ends)", heldState{stopping: true, busy: true}, heldRevokeRelease},
		{"dispatcher stops after the revoke: freed", with(revoked, func(s *heldState) { s.stopping, s.busy = true, true }), heldRelease},
		{"root gone: revoked and freed", heldState{rootGone: true}, heldRevokeRelease},
		{"root gone, busy: revoked and freed (the root is gone)", heldState{rootGone: true, busy: true}, heldRevokeRelease},
		{"maxAge, idle: revoked", heldState{maxAge: true}, heldRevoke},
		{"maxAge, busy: revoked", heldState{maxAge: true, busy: true}, heldRevoke},
		{"queued requests wait: revoked", heldState{queueWaits: true}, heldRevoke},
		{"queued requests wait, busy: revoked", heldState{queueWaits: true, busy: true}, heldRevoke},
		{"revoked, idle, within the grace: kept", with(revoked, func(s *heldState) { s.quiet = leaseEndGrace - time.Millisecond }), heldKeep},
		{"revoked, idle, past the grace: freed", with(revoked, func(s *heldState) { s.quiet = leaseEndGrace }), heldRelease},
		{"revoked, busy, long past maxAge: kept (its request runs on the engine)", with(revoked, func(s *heldState) { s.busy, s.quiet = true, time.Hour }), heldKeep},
		{"revoked for queued requests, busy, they still wait: kept", heldState{queueWaits: true, revoked: true, busy: true, quiet: time.Hour}, heldKeep},
		{"revoked for queued requests, idle past the grace: freed", heldState{queueWaits: true, revoked: true, quiet: leaseEndGrace}, heldRelease},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := decideHeld(c.s); got != c.want {
				t.Errorf("decideHeld(%+v) = %v, want %v", c.s, got, c.want)
			}
		})
	}
}
