package dataplanetest_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/sim"
)

// chaosReport is what a bounded load saw across one fault.
type chaosReport struct {
	accepted, completed, cut, lost, duplicated, serverErrors int
	// wrong counts complete answers that differ from the simulator's
	// deterministic answer to the same request.
	wrong int
	// cutBy counts the errors clients saw on cut requests; cutAt the cut
	// requests per gateway.
	cutBy    map[string]int
	cutAt    map[string]int
	recovery time.Duration
}

func (r chaosReport) String() string {
	return fmt.Sprintf("accepted %d, completed %d, cut %d %v, lost %d, duplicated %d, wrong %d, 5xx %d, recovery %v",
		r.accepted, r.completed, r.cut, r.cutBy, r.lost, r.duplicated, r.wrong, r.serverErrors, r.recovery.Round(10*time.Millisecond))
}

// chaosLoad sends total chat requests, concurrency at a time, half of them
// streamed, calls fault once requests are in flight, and reports. Recovery
// is the time from the fault to the end of the last request that was in
// flight when it happened. wantEvents is the number of SSE events of a
// whole stream. Every complete answer is compared, byte for byte but for
// its ID and creation time, with the engine simulator's answer to the same
// request.
func chaosLoad(t *testing.T, s *dataplanetest.Stack, total, concurrency, wantEvents int, fault func()) chaosReport {
	return chaosLoadOn(t, s, []string{s.Gateway.URL}, total, concurrency, wantEvents, fault)
}

// chaosLoadOn is chaosLoad with the requests spread over several gateways.
func chaosLoadOn(t *testing.T, s *dataplanetest.Stack, urls []string, total, concurrency, wantEvents int, fault func()) chaosReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep := chaosReport{cutBy: map[string]int{}, cutAt: map[string]int{}}
	ref := newReference(s.Engine.Config)
	var (
		mu        sync.Mutex
		faultAt   time.Time
		lastEnded time.Time
		wg        sync.WaitGroup
	)
	sem := make(chan struct{}, concurrency)
	started := make(chan struct{}, total)
	for i := range total {
		if i == concurrency {
			// The first wave is in flight and streams have sent part of
			// their answers: inject the fault.
			for range concurrency {
				<-started
			}
			eventually(t, 10*time.Second, holds("the first wave to reach the engine", func() bool {
				return s.Engine.Active.Load() >= int64(concurrency)
			}))
			time.Sleep(150 * time.Millisecond) // a quarter of an answer, not a wait for an event
			mu.Lock()
			faultAt = time.Now()
			mu.Unlock()
			fault()
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			began := time.Now()
			stream := i%2 == 1
			url := urls[(i/2)%len(urls)]
			body := fmt.Sprintf(`{"model":"sim-model","stream":%t,"messages":[{"role":"user","content":"chaos %d"}]}`, stream, i)
			want := ref.answer("/v1/chat/completions", body)
			req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
			started <- struct{}{}
			o := outcome{stream: stream}
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				b, rerr := io.ReadAll(resp.Body)
				_ = resp.Body.Close()
				o.status, o.body, err = resp.StatusCode, string(b), rerr
			}
			o.err = err
			ended := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if !faultAt.IsZero() && began.Before(faultAt) && ended.After(lastEnded) {
				lastEnded = ended
			}
			switch {
			case ctx.Err() != nil:
				rep.lost++ // no outcome within the bound: a hang
			case o.err != nil && o.status == 0:
				rep.cut++
				rep.cutAt[url]++
				rep.cutBy[errorKind(o.err.Error())]++
			case o.status >= 500:
				rep.serverErrors++
			case o.complete():
				rep.accepted++
				rep.completed++
				if o.stream && strings.Count(o.body, "data: ") != wantEvents {
					rep.duplicated++
				}
				if !sameAnswer(o.body, want) {
					rep.wrong++
					if rep.wrong <= 3 {
						t.Logf("answer differs from the simulator's:\n got: %.600s\nwant: %.600s", o.body, want)
					}
				}
			default:
				rep.accepted++
				rep.cut++
				rep.cutAt[url]++
				rep.cutBy[errorKind(o.body+fmt.Sprint(o.err))]++
			}
		})
	}
	wg.Wait()
	rep.recovery = lastEnded.Sub(faultAt)
	return rep
}

// reference answers requests as the engine simulator does, at once: the
// answer a client must get, word for word, whatever happened on the way.
type reference struct{ h http.Handler }

func newReference(cfg sim.Config) reference {
	cfg.TimeToFirstToken, cfg.InterTokenLatency, cfg.Faults = 0, 0, sim.Faults{}
	return reference{h: sim.New(cfg).Handler()}
}

// answer returns the body of the simulator's answer to a POST of body.
func (r reference) answer(path, body string) string {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	r.h.ServeHTTP(rec, req)
	return rec.Body.String()
}

// perResponse matches what differs between two answers to the same
// request: the response ID and its creation time.
var perResponse = regexp.MustCompile(`"id":"[^"]*"|"created":[0-9]+`)

// sameAnswer reports whether two answers are the same, byte for byte,
// apart from their IDs and creation times.
func sameAnswer(got, want string) bool {
	return perResponse.ReplaceAllString(got, "") == perResponse.ReplaceAllString(want, "")
}

// errorKind names an error a client saw, without the variable parts.
func errorKind(s string) string {
	for _, k := range []string{"stream_interrupted", "connection reset", "EOF", "connection refused", "service_unavailable", "timeout"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	return tail(s, 80)
}

// TestChaos injects one fault per case into an in-process data plane under
// a bounded load (48 requests, 16 at a time, half streamed) and checks what
// clients saw: nothing lost, nothing duplicated, recovered within 5 s, and
// cuts and 5xx only where documented (docs/reliability.md).
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos suite: about a minute")
	}
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 40
	simCfg.InterTokenLatency = 15 * time.Millisecond // 0.6 s per answer
	const total, concurrency = 48, 16
	cases := []struct {
		name string
		// fault breaks the stack; maxCut is the most streams it may cut.
		fault  func(t *testing.T, s *dataplanetest.Stack, victim *dataplanetest.Dispatcher)
		maxCut int
	}{{
		name: "one of two dispatchers killed",
		fault: func(t *testing.T, s *dataplanetest.Stack, victim *dataplanetest.Dispatcher) {
			victim.Kill()
		},
		// Streams that the dead dispatcher had started are cut: at most
		// its half of the streams in flight.
		maxCut: concurrency / 2,
	}, {
		name: "NATS restarted",
		fault: func(t *testing.T, s *dataplanetest.Stack, _ *dataplanetest.Dispatcher) {
			if err := s.RestartNATS(); err != nil {
				t.Fatal(err)
			}
		},
	}, {
		name: "engine connections dropped mid-answer",
		fault: func(t *testing.T, s *dataplanetest.Stack, _ *dataplanetest.Dispatcher) {
			s.Engine.CloseClientConnections()
		},
		// A started stream whose engine broke off is cut; the rest retry.
		maxCut: concurrency / 2,
	}}
	t.Run("one of two gateways killed", func(t *testing.T) {
		s := startStack(t, simCfg, func(sc *dataplanetest.StackConfig) {
			sc.Dispatcher = func(d *dispatch.Config) { d.AckWait = dispatch.Default().AckWait }
		})
		dispatcher(t, s)
		other, err := s.StartGateway()
		if err != nil {
			t.Fatal(err)
		}
		rep := chaosLoadOn(t, s, []string{s.Gateway.URL, other.URL}, total, concurrency, 42, func() {
			// The process dies: its connections drop, its port closes.
			s.Gateway.CloseClientConnections()
			_ = s.Gateway.Listener.Close()
		})
		t.Logf("one of two gateways killed: %v", rep)
		if rep.lost != 0 || rep.duplicated != 0 || rep.wrong != 0 || rep.serverErrors != 0 {
			t.Errorf("lost %d, duplicated %d, wrong %d, 5xx %d; want 0 each", rep.lost, rep.duplicated, rep.wrong, rep.serverErrors)
		}
		if n := rep.cutAt[other.URL]; n != 0 {
			t.Errorf("%d requests to the surviving gateway were cut, want 0", n)
		}
		if rep.cutAt[s.Gateway.URL] == 0 {
			t.Error("no request to the killed gateway failed: the test proves nothing")
		}
		if rep.recovery > 5*time.Second {
			t.Errorf("the killed gateway's clients waited %v for their error, want at most 5s", rep.recovery)
		}
	})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := startStack(t, simCfg, func(sc *dataplanetest.StackConfig) {
				sc.Dispatcher = func(d *dispatch.Config) { d.AckWait = dispatch.Default().AckWait }
			})
			victim := dispatcher(t, s)
			dispatcher(t, s)
			wantEvents := 42 // role, 40 tokens, [DONE]
			rep := chaosLoad(t, s, total, concurrency, wantEvents, func() { c.fault(t, s, victim) })
			t.Logf("%s: %v", c.name, rep)
			if rep.lost != 0 || rep.duplicated != 0 || rep.wrong != 0 || rep.serverErrors != 0 {
				t.Errorf("lost %d, duplicated %d, wrong %d, 5xx %d; want 0 each", rep.lost, rep.duplicated, rep.wrong, rep.serverErrors)
			}
			if rep.cut > c.maxCut {
				t.Errorf("%d requests cut, want at most %d", rep.cut, c.maxCut)
			}
			if rep.completed+rep.cut != total {
				t.Errorf("completed %d + cut %d != %d requests", rep.completed, rep.cut, total)
			}
			if rep.recovery > 5*time.Second {
				t.Errorf("recovery took %v, want at most 5s", rep.recovery)
			}
		})
	}
}
