package dataplanetest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// post sends a chat body to the gateway and returns the status and body.
func post(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// chatOfSize is a chat request body of exactly n bytes.
func chatOfSize(n int) []byte {
	head, tail := `{"model":"sim-model","messages":[{"role":"user","content":"`, `"}]}`
	return []byte(head + strings.Repeat("x", n-len(head)-len(tail)) + tail)
}

// TestBodyJustUnderTheLimitIsServed: a body of limits.maxBodyBytes is
// queued and answered (it used to get 503 with Retry-After, forever, because
// NATS refused it once its headers were added); one byte more is a 413.
func TestBodyJustUnderTheLimitIsServed(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), nil)
	dispatcher(t, s)
	limit := gateway.Default().Limits.MaxBodyBytes
	if status, body := post(t, s.Gateway.URL, chatOfSize(int(limit))); status != 200 {
		t.Errorf("body of maxBodyBytes: %d %.300s", status, body)
	}
	if status, body := post(t, s.Gateway.URL, chatOfSize(int(limit)+1)); status != 413 {
		t.Errorf("body of maxBodyBytes+1: %d %.300s, want 413", status, body)
	}
}

// outcome is what a client saw of one request.
type outcome struct {
	stream bool
	status int
	body   string
	err    error
	done   time.Time
	// want is the simulator's answer to the request, when known.
	want string
}

// complete reports whether the client got a whole answer: a 200 with the
// JSON completion, or a stream ending in [DONE] without an error event.
func (o outcome) complete() bool {
	if o.err != nil || o.status != 200 {
		return false
	}
	if o.stream {
		return strings.HasSuffix(o.body, "data: [DONE]\n\n") && !strings.Contains(o.body, `data: {"error"`)
	}
	return strings.Contains(o.body, `"finish_reason"`)
}

// fire sends n chat requests at once to the stack's gateway, every other
// one streamed, and returns a channel with one outcome per request.
func fire(ctx context.Context, s *dataplanetest.Stack, n int) <-chan outcome {
	out := make(chan outcome, n)
	ref := newReference(s.Engine.Config)
	for i := range n {
		go func() {
			stream := i%2 == 1
			body := fmt.Sprintf(`{"model":"sim-model","stream":%t,"messages":[{"role":"user","content":"request %d"}]}`, stream, i)
			req, _ := http.NewRequestWithContext(ctx, "POST", s.Gateway.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
			o := outcome{stream: stream, want: ref.answer("/v1/chat/completions", body)}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				o.status, o.body, err = resp.StatusCode, string(b), rerr
			}
			o.err, o.done = err, time.Now()
			out <- o
		}()
	}
	return out
}

// settle collects n outcomes and fails the test unless every one is
// complete and, where known, the simulator's answer word for word; it
// returns when the last one arrived.
func settle(t *testing.T, n int, out <-chan outcome) time.Time {
	t.Helper()
	var last time.Time
	for range n {
		o := <-out
		switch {
		case !o.complete():
			t.Errorf("request not answered completely: status %d, err %v, body %.300s", o.status, o.err, o.body)
		case o.want != "" && !sameAnswer(o.body, o.want):
			t.Errorf("answer differs from the simulator's:\n got: %.600s\nwant: %.600s", o.body, o.want)
		}
		if o.done.After(last) {
			last = o.done
		}
	}
	return last
}

// startSlowStack starts a stack whose engine sends nothing for a second
// after a request arrives: requests being served at a given moment have
// sent nothing to their clients yet.
func startSlowStack(t *testing.T) *dataplanetest.Stack {
	s := startStack(t, dataplanetest.FastSim(), func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) { d.AckWait = dispatch.Default().AckWait }
	})
	s.Engine.Hold.Store(int64(time.Second))
	return s
}

// TestDeadDispatchersRequestsAnsweredWithin5s: with two dispatchers, the
// requests held by one that dies (its connection dropped at once, as on
// SIGKILL or node loss) are redelivered to the other and answered within
// 5 s of the death: non-streamed ones and streams that had not sent a byte,
// without the client noticing. (With ackWait 30 s they used to take 30 s.)
func TestDeadDispatchersRequestsAnsweredWithin5s(t *testing.T) {
	s := startSlowStack(t)
	victim := dispatcher(t, s)
	dispatcher(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 32
	out := fire(ctx, s, n)
	eventually(t, 10*time.Second, holds("every request to reach the engine", func() bool { return s.Engine.Active.Load() == n }))
	held := victim.InFlight()
	victim.Kill()
	died := time.Now()
	last := settle(t, n, out)
	recovery := last.Sub(died)
	t.Logf("%d requests, %d of them held by the dead dispatcher; all answered %v after its death; engine ran %d attempts",
		n, held, recovery.Round(time.Millisecond), s.Engine.Requests.Load())
	if held == 0 {
		t.Error("the dead dispatcher held no request: the test proves nothing")
	}
	if recovery > 5*time.Second {
		t.Errorf("the dead dispatcher's requests were answered %v after its death, want within 5s", recovery)
	}
}

// TestHundredsOfRequestsOfADeadDispatcherRedeliveredWithin5s: a
// dispatcher that dies holding several hundred requests (most at the
// engine, the rest held for an engine slot) hands every one of them to
// another dispatcher within 5 s of its death, whatever its load: each
// request reports its own progress, so JetStream redelivers all of them
// one ackWait (3 s) after the death. The bound covers the redelivery, the
// restart of the work on an engine; the answer then takes the engine's
// time for it (here almost none).
func TestHundredsOfRequestsOfADeadDispatcherRedeliveredWithin5s(t *testing.T) {
	if testing.Short() {
		t.Skip("several hundred requests")
	}
	const n, slots, prefetch = 400, 320, 128
	const waitLimit = 30 * time.Second
	simCfg := dataplanetest.FastSim()
	simCfg.MaxNumSeqs = 2 * n
	s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) {
			d.AckWait = dispatch.Default().AckWait
			d.HeartbeatInterval = dispatch.Default().HeartbeatInterval
			d.Apps[0].MaxConcurrency = slots
			d.Prefetch = prefetch
			// The dead dispatcher's engine calls end soon after its death,
			// as a dead process's connections do.
			d.ShutdownTimeout.Duration = time.Second
		}
		// The gateway waits for a redelivery as long as in production, so
		// that what is measured is the dispatchers' handover: with the
		// stack's short waits, a machine slowed down for seconds could make
		// the gateway give up on a request before it is redelivered.
		c.Queue = func(q *natsqueue.ClientConfig) {
			def := natsqueue.DefaultClientConfig()
			q.StallTimeout, q.RedeliveryWait = def.StallTimeout, def.RedeliveryWait
		}
	})
	// Until the death, the engine sends nothing: the victim's requests have
	// sent nothing to their clients, and can be answered transparently.
	s.Engine.Hold.Store(int64(time.Minute))
	// Every request's body is its own ("request <i>"): the engine counts
	// the attempts of each, so that a request sent twice after the death
	// does not hide one not sent again.
	arrivals := newArrivals()
	s.Engine.Seen = arrivals.see
	victim := dispatcher(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := fire(ctx, s, n)
	eventually(t, 30*time.Second, holds(fmt.Sprintf("the dispatcher to hold all %d requests", n), func() bool {
		return victim.InFlight() == n
	}))
	load, _ := victim.Load(dataplanetest.App)
	if load.InFlight != slots || load.Held != n-slots {
		t.Fatalf("the dispatcher serves %d and holds %d for a slot, want %d and %d", load.InFlight, load.Held, slots, n-slots)
	}
	// Its successor runs before the death, as another replica would; it
	// has nothing of its own to do, so whatever it serves is redelivered.
	dispatcher(t, s)
	before := arrivals.snapshot()
	s.Engine.Hold.Store(0)
	victim.Kill()
	died := time.Now()
	var first, redelivered time.Duration
	var again, twice int
	for {
		redelivered = time.Since(died)
		again, twice = arrivals.since(before)
		if first == 0 && again > 0 {
			first = redelivered
		}
		if again == n {
			break
		}
		if redelivered > waitLimit {
			t.Fatalf("%v after the dispatcher's death, %d of its %d requests reached the engine again (%d of them more than once); %d clients were answered, the first failures: %v",
				waitLimit, again, n, twice, len(out), failures(out, 3))
		}
		time.Sleep(10 * time.Millisecond)
	}
	answered := settle(t, n, out).Sub(died)
	t.Logf("%d requests (%d at the engine, %d held for a slot) of a dead dispatcher: the first redelivered to the engine %v after its death, all %v after it (%d more than once), all answered %v after it",
		n, load.InFlight, load.Held, first.Round(10*time.Millisecond), redelivered.Round(10*time.Millisecond), twice, answered.Round(10*time.Millisecond))
	if redelivered > 5*time.Second {
		t.Errorf("the dead dispatcher's requests were redelivered %v after its death, want within 5s", redelivered)
	}
}

// TestRequestsInFlightAnsweredWithin5sOfANATSRestart: requests being served
// while NATS restarts are answered within 5 s of its return.
func TestRequestsInFlightAnsweredWithin5sOfANATSRestart(t *testing.T) {
	s := startSlowStack(t)
	dispatcher(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 16
	out := fire(ctx, s, n)
	eventually(t, 10*time.Second, holds("every request to reach the engine", func() bool { return s.Engine.Active.Load() == n }))
	if err := s.RestartNATS(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	last := settle(t, n, out)
	recovery := last.Sub(back)
	t.Logf("%d requests in flight across a NATS restart: all answered %v after NATS was back; engine ran %d attempts",
		n, recovery.Round(time.Millisecond), s.Engine.Requests.Load())
	if recovery > 5*time.Second {
		t.Errorf("answered %v after NATS was back, want within 5s", recovery)
	}
}

// TestLivenessCost measures what keeping requests alive costs NATS: the
// messages per in-flight request per second while the engine works (progress
// to JetStream every ackWait/3, heartbeats to the gateway every
// heartbeatInterval), with the production defaults.
func TestLivenessCost(t *testing.T) {
	s := startStack(t, dataplanetest.FastSim(), func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) {
			def := dispatch.Default()
			d.AckWait, d.HeartbeatInterval = def.AckWait, def.HeartbeatInterval
		}
		c.Queue = func(q *natsqueue.ClientConfig) { q.StallTimeout = natsqueue.DefaultClientConfig().StallTimeout }
	})
	s.Engine.Hold.Store(int64(8 * time.Second))
	dispatcher(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 32
	out := fire(ctx, s, n)
	eventually(t, 10*time.Second, holds("every request to reach the engine", func() bool { return s.Engine.Active.Load() == n }))
	const window = 4 * time.Second
	before, err := s.NATS.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(window) // a measurement window, not a wait for an event
	after, err := s.NATS.Varz(nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Engine.Active.Load() != n {
		t.Fatal("requests finished during the measurement")
	}
	perJob := float64(after.InMsgs-before.InMsgs) / n / window.Seconds()
	t.Logf("liveness: %d messages into NATS in %v for %d requests in flight: %.2f messages per request per second",
		after.InMsgs-before.InMsgs, window, n, perJob)
	// Progress every ackWait/3 (1/s) and a heartbeat every 2 s (0.5/s).
	if perJob > 2 {
		t.Errorf("liveness costs %.2f messages per request per second, want at most 2", perJob)
	}
	settle(t, n, out)
}

// TestStreamsSurviveANATSRestart: streams being generated while NATS
// restarts reach their clients whole, without an error, a duplicated or a
// missing byte: the dispatcher keeps each attempt's chunks until the gateway
// has them, and the gateway asks for what it missed.
func TestStreamsSurviveANATSRestart(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 60
	simCfg.InterTokenLatency = 25 * time.Millisecond // 1.5 s per answer
	s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) { d.AckWait = dispatch.Default().AckWait }
	})
	dispatcher(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const n = 16
	out := make(chan outcome, n)
	for i := range n {
		go func() {
			body := fmt.Sprintf(`{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"stream %d"}]}`, i)
			req, _ := http.NewRequestWithContext(ctx, "POST", s.Gateway.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
			o := outcome{stream: true}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				o.status, o.body, err = resp.StatusCode, string(b), rerr
			}
			o.err, o.done = err, time.Now()
			out <- o
		}()
	}
	eventually(t, 10*time.Second, holds("every stream to be generating", func() bool { return s.Engine.Active.Load() == n }))
	time.Sleep(300 * time.Millisecond) // let every stream send part of its answer first
	if err := s.RestartNATS(); err != nil {
		t.Fatal(err)
	}
	cut := 0
	for range n {
		o := <-out
		if !o.complete() {
			cut++
			t.Errorf("stream cut by the NATS restart: status %d, err %v, last bytes %q", o.status, o.err, tail(o.body, 300))
			continue
		}
		// The role event, 60 content events (the last with the finish
		// reason) and [DONE]; every event exactly once.
		if events := strings.Count(o.body, "data: "); events != 62 {
			t.Errorf("stream has %d events, want 62 (none missing or duplicated)", events)
		}
	}
	t.Logf("%d streams across a NATS restart: %d cut; engine ran %d attempts", n, cut, s.Engine.Requests.Load())
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// arrivals counts the attempts of each request body an engine received.
type arrivals struct {
	mu    sync.Mutex
	count map[string]int
}

func newArrivals() *arrivals { return &arrivals{count: map[string]int{}} }

func (a *arrivals) see(body []byte) {
	a.mu.Lock()
	a.count[string(body)]++
	a.mu.Unlock()
}

func (a *arrivals) snapshot() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.count)
}

// since reports how many requests arrived again after before was taken,
// and how many of those more than once.
func (a *arrivals) since(before map[string]int) (again, twice int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for body, c := range a.count {
		switch c - before[body] {
		case 0:
		case 1:
			again++
		default:
			again++
			twice++
		}
	}
	return again, twice
}

// failures reads the outcomes already in out and describes up to most of
// them that are not a complete answer.
func failures(out <-chan outcome, most int) []string {
	var failed []string
	for {
		select {
		case o := <-out:
			switch {
			case o.err != nil:
				failed = append(failed, o.err.Error())
			case o.status != http.StatusOK:
				failed = append(failed, fmt.Sprintf("%d %s", o.status, tail(o.body, 300)))
			default:
				continue
			}
			if len(failed) == most {
				return failed
			}
		default:
			return failed
		}
	}
}
