package natsqueue

import (
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// progressStale is how long a dispatcher's wake progress is believed
// without being said again (dispatchers repeat it every 5 s).
const progressStale = 20 * time.Second

// WakeProgress keeps the last wake progress the dispatchers said for each
// application (Names.WakeProgress).
type WakeProgress struct {
	sub *nats.Subscription

	mu   sync.Mutex
	last map[string]progressSaid
}

type progressSaid struct {
	text string
	at   time.Time
}

// WatchWakeProgress subscribes to the dispatchers' wake progress; Close
// ends it.
func (c *Client) WatchWakeProgress() (*WakeProgress, error) {
	w := &WakeProgress{last: map[string]progressSaid{}}
	sub, err := c.nc.Subscribe(c.names.WakeProgress("*"), func(m *nats.Msg) {
		app := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		w.mu.Lock()
		w.last[app] = progressSaid{text: string(m.Data), at: time.Now()}
		w.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	w.sub = sub
	return w, nil
}

// PodProgress returns the last progress said for app, or "" when none was
// said recently.
func (w *WakeProgress) PodProgress(app string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.last[app]
	if time.Since(s.at) > progressStale {
		return ""
	}
	return s.text
}

// Close ends the subscription.
func (w *WakeProgress) Close() { _ = w.sub.Unsubscribe() }
