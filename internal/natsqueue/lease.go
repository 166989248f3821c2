package natsqueue

// Leases: a dispatcher lends a gateway one engine slot, so that the
// gateway can call a ready engine straight (its direct lane) while the slot
// counts where every slot counts: against the root's maxConcurrency in the
// dispatcher's pool, and as in flight for the lifecycle leader, which reads
// the lease consumer's unacknowledged messages.
//
// # Protocol
//
// The gateway publishes a lease request into the request stream on
// Names.Lease(app), with Orch-Reply (a core NATS subject it listens on)
// and Orch-Deadline (Unix milliseconds after which it no longer waits).
// Each application has a second durable consumer, Names.LeaseConsumer,
// filtered on that subject; the lifecycle gate pauses it with the
// application's request consumer. A dispatcher that takes the request
// takes a free slot on a root (only spare capacity is lent: with none
// free it refuses at once, Orch-Refusal: busy) and sends the grant (a
// LeaseGrant, JSON) to Orch-Reply as a request: the gateway answers LeaseTaken, or anything
// else (or nothing) when it no longer wants it, and the slot is freed.
// While the gateway holds the lease the dispatcher keeps the request
// unacknowledged (progress every AckWait/3). The gateway gives the lease
// back on Names.LeaseReturn(app) with the lease ID as the body, followed
// by " failed" when the engine failed on it; the dispatcher then frees
// the slot and acknowledges the request. The dispatcher takes a lease back,
// with a KindRevoked message on Orch-Reply, at its MaxAge, when queued
// requests wait for a slot, when its root leaves or is ejected, and when
// the dispatcher stops. Taken back at MaxAge or for queued requests, a
// lease keeps its slot while the gateway's use reports (below) say a
// request runs on it, since that request runs on the engine until it ends:
// the slot is freed when the gateway gives the lease back (it does after
// that request), or once no report younger than LeaseUseStale says busy
// and none came for a short grace (the return was lost, or the gateway is
// gone). A root that left or a dispatcher that stops frees the
// slot at once. A request past its deadline is acknowledged and dropped;
// one the dispatcher cannot serve (routing must choose the root:
// Orch-Refusal: routing) is refused.
//
// # Use reports
//
// A held lease counts as in flight on the lease consumer whether or not a
// request runs on it, and a gateway keeps an unused lease while the
// application serves. So that an idle lease does not keep an application
// awake, the gateway tells the lifecycle leader (and the dispatcher that
// lent the lease, see above) how it uses each lease: a
// LeaseUse (JSON) published on core NATS (outside the stream) on
// Names.LeaseUse(app) soon after a request starts on the lease (Busy true;
// beside the request, off its path), every LeaseUseEvery while it runs,
// and when it ends (Busy false). The leader
// counts a held lease as active demand only while a report younger than
// LeaseUseStale says a request runs on it, and every report as use of the
// application (internal/lifecycle, demand.go). Reports are best effort:
// a lost one delays sleep by at most LeaseUseStale, and a held lease still
// holds off the sleep or drain itself until it is given back (the gateway
// gives it back once the application leaves serving, after the request it
// runs ends).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"

	"github.com/model-orchestra/operator/internal/queue"
)

// HeaderDeadline is a lease request's deadline, in Unix milliseconds.
const HeaderDeadline = "Orch-Deadline"

// Lease message kinds (values of HeaderKind on Orch-Reply).
const (
	KindGrant   = "grant"
	KindRefused = "refused"
	KindRevoked = "revoked"
)

// HeaderRefusal says why a lease request was refused (KindRefused).
const HeaderRefusal = "Orch-Refusal"

// Refusals (values of HeaderRefusal).
const (
	// RefusalRouting: the application's routing chooses each request's
	// root; asking again soon cannot help.
	RefusalRouting = "routing"
	// RefusalBusy: no engine slot is free now (only spare capacity is
	// lent).
	RefusalBusy = "busy"
)

// LeaseTaken is the gateway's answer to a grant it keeps.
const LeaseTaken = "taken"

// LeaseFailed follows the lease ID in a return when the engine failed.
const LeaseFailed = " failed"

// LeaseGrant is a dispatcher's grant of one engine slot.
type LeaseGrant struct {
	// ID names the lease in its return.
	ID string `json:"id"`
	// Root is the engine root's base URL.
	Root string `json:"root"`
	// Roots is how many roots the application has.
	Roots int `json:"roots"`
	// MaxAgeMillis bounds the lease's life from the grant on.
	MaxAgeMillis int64 `json:"maxAgeMillis"`
}

// Lease is the subject of an application's lease requests.
func (n Names) Lease(app string) string { return "orchestra." + n.token() + ".lease." + app }

// LeaseWildcard matches every application's lease requests.
func (n Names) LeaseWildcard() string { return "orchestra." + n.token() + ".lease.*" }

// LeaseConsumer is the durable pull consumer of an application's lease
// requests.
func (n Names) LeaseConsumer(app string) string { return "lease-" + app }

// LeaseReturn is where gateways give leases of an application back.
func (n Names) LeaseReturn(app string) string {
	return "orchestra." + n.token() + ".lease-return." + app
}

// LeaseUse is a gateway's report of how it uses a lease (see Use reports
// above).
type LeaseUse struct {
	// Instance is the gateway instance holding the lease.
	Instance string `json:"instance"`
	// Lease is the lease's ID.
	Lease string `json:"lease"`
	// Busy: a request runs on the lease now.
	Busy bool `json:"busy"`
}

// LeaseUseEvery is how often a gateway reports a lease that a request
// runs on (a heartbeat).
const LeaseUseEvery = time.Second

// LeaseUseStale is the age after which a report no longer counts: three
// heartbeats.
const LeaseUseStale = 3 * LeaseUseEvery

// LeaseUseFresh reports whether a use report received at `at` still counts
// at now: the one rule by which the lifecycle leader and the dispatchers
// read the reports.
func LeaseUseFresh(at, now time.Time) bool { return now.Sub(at) < LeaseUseStale }

// LeaseUse is where gateways report their use of an application's
// leases: core NATS, outside the request stream (whose subjects are
// Request and Lease).
func (n Names) LeaseUse(app string) string {
	return "orchestra." + n.token() + ".lease-use." + app
}

// LeaseUseWildcard matches every application's use reports; the
// application is the subject's last token.
func (n Names) LeaseUseWildcard() string { return "orchestra." + n.token() + ".lease-use.*" }

// ParseLeaseUse reads a use report.
func ParseLeaseUse(b []byte) (LeaseUse, error) {
	var u LeaseUse
	if err := json.Unmarshal(b, &u); err != nil {
		return LeaseUse{}, fmt.Errorf("malformed lease use report: %w", err)
	}
	if u.Instance == "" || u.Lease == "" {
		return LeaseUse{}, errors.New("malformed lease use report: instance and lease are required")
	}
	return u, nil
}

// leaseWait bounds how long a gateway waits for a grant: a lease is only
// worth having soon (requests meanwhile take the queue).
const leaseWait = 2 * time.Second

var _ queue.Leaser = (*Client)(nil)

// Lease asks the application's dispatchers for an engine slot (see the
// protocol above). It waits at most until ctx ends or leaseWait passes.
func (c *Client) Lease(ctx context.Context, app string) (queue.Lease, error) {
	if err := ValidToken(app); err != nil {
		return queue.Lease{}, fmt.Errorf("application: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, leaseWait)
	defer cancel()
	deadline, _ := ctx.Deadline()
	inbox := c.prefix + "lease." + strings.ToLower(nuid.Next())
	grants := make(chan *nats.Msg, 1)
	revoked := make(chan struct{})
	var (
		mu      sync.Mutex
		granted bool
		once    sync.Once
	)
	sub, err := c.nc.Subscribe(inbox, func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		switch m.Header.Get(HeaderKind) {
		case KindGrant:
			if granted {
				_ = m.Respond([]byte(AcceptGone)) // one lease per request
				return
			}
			select {
			case grants <- m:
				granted = true
			default:
				_ = m.Respond([]byte(AcceptGone))
			}
		case KindRefused:
			select {
			case grants <- m:
			default:
			}
		case KindRevoked:
			once.Do(func() { close(revoked) })
		}
	})
	if err != nil {
		return queue.Lease{}, fmt.Errorf("listening for a lease: %w", err)
	}
	h := nats.Header{
		HeaderApp:      []string{app},
		HeaderReply:    []string{inbox},
		HeaderDeadline: []string{strconv.FormatInt(deadline.UnixMilli(), 10)},
	}
	msg := &nats.Msg{Subject: c.names.Lease(app), Header: h}
	if _, err := c.js.PublishMsg(ctx, msg); err != nil {
		_ = sub.Unsubscribe()
		return queue.Lease{}, fmt.Errorf("%w: asking for a lease: %w", queue.ErrNoLease, err)
	}
	var m *nats.Msg
	select {
	case m = <-grants:
	case <-ctx.Done():
		mu.Lock()
		// A grant that arrives from now on is answered "gone".
		granted = true
		select {
		case m = <-grants:
		default:
		}
		mu.Unlock()
		if m == nil || m.Header.Get(HeaderKind) != KindGrant {
			_ = sub.Unsubscribe()
			return queue.Lease{}, fmt.Errorf("%w: no slot within %s", queue.ErrNoLease, leaseWait)
		}
	}
	if m.Header.Get(HeaderKind) == KindRefused {
		_ = sub.Unsubscribe()
		if m.Header.Get(HeaderRefusal) == RefusalRouting {
			return queue.Lease{}, fmt.Errorf("%w: %s", queue.ErrLeaseRefused, m.Header.Get(HeaderReason))
		}
		return queue.Lease{}, fmt.Errorf("%w: %s", queue.ErrNoLease, m.Header.Get(HeaderReason))
	}
	var g LeaseGrant
	if err := json.Unmarshal(m.Data, &g); err != nil || g.ID == "" || g.Root == "" {
		_ = m.Respond([]byte(AcceptGone))
		_ = sub.Unsubscribe()
		return queue.Lease{}, fmt.Errorf("%w: malformed grant", queue.ErrNoLease)
	}
	if err := m.Respond([]byte(LeaseTaken)); err != nil {
		_ = sub.Unsubscribe()
		return queue.Lease{}, fmt.Errorf("%w: taking the grant: %w", queue.ErrNoLease, err)
	}
	var ret sync.Once
	subject := c.names.LeaseReturn(app)
	useSubject := c.names.LeaseUse(app)
	return queue.Lease{
		ID:      g.ID,
		Root:    g.Root,
		Roots:   g.Roots,
		Expires: time.Now().Add(time.Duration(g.MaxAgeMillis) * time.Millisecond),
		Revoked: revoked,
		Return: func(failed bool) {
			ret.Do(func() {
				body := g.ID
				if failed {
					body += LeaseFailed
				}
				_ = c.nc.Publish(subject, []byte(body))
				_ = sub.Unsubscribe()
			})
		},
		Report: func(busy bool) {
			b, _ := json.Marshal(LeaseUse{Instance: c.cfg.Instance, Lease: g.ID, Busy: busy})
			_ = c.nc.Publish(useSubject, b)
		},
	}, nil
}

// ParseLeaseReturn reads a lease return's body.
func ParseLeaseReturn(b []byte) (id string, failed bool, err error) {
	s := string(b)
	id, failed = strings.CutSuffix(s, LeaseFailed)
	if id == "" || strings.ContainsAny(id, " \t\r\n") {
		return "", false, errors.New("malformed lease return")
	}
	return id, failed, nil
}
