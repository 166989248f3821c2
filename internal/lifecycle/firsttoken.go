package lifecycle

import (
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// The first token of a wake. The dispatcher that sends the first answer
// data of a request that waited for a wake is seldom the leader, which
// alone publishes the LifecycleStatus: it publishes a FirstToken on
// FirstTokenSubject, and the leader fills lastWake.firstTokenSeconds from
// it (the earliest first token of the wake, from the wake's start). The
// seconds compare the two replicas' wall clocks, so they carry the nodes'
// clock skew (milliseconds with NTP).

// FirstToken is the message a dispatcher publishes when it sends the first
// answer data of a request that waited for a wake.
type FirstToken struct {
	// WakeStart is the wake's startTime as the dispatcher read it from the
	// lifecycle bucket (whole seconds): it names the wake.
	WakeStart time.Time `json:"wakeStart"`
	// At is when the first answer data went out.
	At time.Time `json:"at"`
}

// FirstTokenSubject is where the dispatchers of orchestra publish the
// first token of app's wakes.
func FirstTokenSubject(orchestra, app string) string {
	return firstTokenPrefix(orchestra) + app
}

func firstTokenPrefix(orchestra string) string {
	return "orchestra." + strings.ReplaceAll(orchestra, ".", "_") + ".lifecycle.first_token."
}

// firstTokenBox holds the earliest first token reported for one wake until
// the application's goroutine takes it.
type firstTokenBox struct {
	mu sync.Mutex
	ft *FirstToken
}

// offer keeps ft if it names another wake than the one held, or came
// earlier.
func (b *firstTokenBox) offer(ft FirstToken) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ft == nil || b.ft.WakeStart.Unix() != ft.WakeStart.Unix() || ft.At.Before(b.ft.At) {
		b.ft = &ft
	}
}

func (b *firstTokenBox) take() *FirstToken {
	b.mu.Lock()
	defer b.mu.Unlock()
	ft := b.ft
	b.ft = nil
	return ft
}

// publishFirstToken hands the first token of the wake that started at
// wakeStart to the leader.
func (c *Controller) publishFirstToken(app string, wakeStart, at time.Time) {
	b, _ := json.Marshal(FirstToken{WakeStart: wakeStart, At: at})
	if err := c.deps.NC.Publish(FirstTokenSubject(c.deps.Orchestra, app), b); err != nil {
		c.log.Warn("handing the first token of a wake to the leader", "app", app, "err", err)
	}
}

// subscribeFirstTokens makes the leader hear every application's first
// tokens until the returned function is called.
func (c *Controller) subscribeFirstTokens() (func(), error) {
	prefix := firstTokenPrefix(c.deps.Orchestra)
	sub, err := c.deps.NC.Subscribe(prefix+"*", func(m *nats.Msg) {
		a := c.app(strings.TrimPrefix(m.Subject, prefix))
		var ft FirstToken
		if a == nil || json.Unmarshal(m.Data, &ft) != nil || ft.At.IsZero() {
			return
		}
		a.firstTokens.offer(ft)
		a.kickNow()
	})
	if err != nil {
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// applyFirstToken fills the last wake's firstTokenSeconds from a first
// token reported for it: the earliest one, from the wake's start.
func (c *Controller) applyFirstToken(a *appState) {
	ft := a.firstTokens.take()
	if ft == nil {
		return
	}
	lw := a.status.LastWake
	if lw == nil || lw.StartTime == nil || lw.StartTime.Unix() != ft.WakeStart.Unix() {
		return // a wake that is no longer the last
	}
	secs := max(ft.At.Sub(lw.StartTime.Time), 0).Seconds()
	if cur, err := strconv.ParseFloat(lw.FirstTokenSeconds, 64); err == nil && cur <= secs {
		return
	}
	lw.FirstTokenSeconds = strconv.FormatFloat(secs, 'f', 3, 64)
	c.log.Info("first token of the wake", "app", a.Name, "from", lw.FromTier, "seconds", secs)
	a.changed()
}
