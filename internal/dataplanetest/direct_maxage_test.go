package dataplanetest_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
	"github.com/model-orchestra/operator/internal/polltest"
)

// shortChat is a one-token answer: quick whatever the simulator's pace.
const shortChat = `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`

// TestALongDirectStreamKeepsItsSlotPastMaxAge: with one slot a root, a
// streamed answer on the direct lane that outlives the dispatcher's
// leaseMaxAge keeps its slot to the end: the dispatcher revokes the lease
// at maxAge but, told by the gateway's use reports that a request runs on
// it, does not give its slot to a request queued meanwhile, which waits
// for the stream to end instead of running beside it on the engine.
func TestALongDirectStreamKeepsItsSlotPastMaxAge(t *testing.T) {
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 50
	simCfg.InterTokenLatency = 40 * time.Millisecond // a 2 s answer
	maxAge := time.Second
	s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) {
			d.Apps[0].MaxConcurrency = 1
			d.LeaseMaxAge.Duration = maxAge
		}
		c.Gateway = func(g *gateway.Config) {
			g.Models[0].DirectLane = true
			g.Direct.LeaseIdle.Duration = time.Minute
		}
	})
	// The most requests the engine ran at once, seen as each one arrives.
	var most atomic.Int64
	s.Engine.Seen = func([]byte) {
		n := s.Engine.Active.Load()
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				return
			}
		}
	}
	d := dispatcher(t, s)

	// The long stream must take the direct lane; it takes the queue when
	// it comes in the instant the gateway renews its lease: then again.
	var streamed <-chan string
	for attempt := 1; ; attempt++ {
		polltest.Eventually(t, 10*time.Second, 200*time.Millisecond, func() error {
			if leasesHeld(d) == 1 {
				return nil
			}
			if status, body := send(t, s.Gateway.URL, "/v1/chat/completions", shortChat); status != 200 {
				t.Fatalf("request: %d %s", status, body)
			}
			return fmt.Errorf("no lease held yet")
		})
		var lane string
		lane, streamed = startStream(s.Gateway.URL+"/v1/chat/completions", chatStream)
		if lane == "direct" {
			break
		}
		<-streamed
		if attempt == 3 {
			t.Fatalf("the long stream took lane %q three times, with a lease held before each", lane)
		}
	}
	// At maxAge the dispatcher takes the lease back, finding it busy.
	eventually(t, 5*time.Second, func() error {
		if n := dispatcherMetric(d, "orchestra_dispatcher_lease_busy_takebacks_total"); n != 1 {
			return fmt.Errorf("%v busy leases taken back", n)
		}
		return nil
	})
	if status, body, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", shortChat, "queue"); status != 200 || lane != "queue" {
		t.Fatalf("the queued request: %d (lane %q) %s", status, lane, body)
	}
	select {
	case body := <-streamed:
		if !strings.Contains(body, "data: [DONE]") {
			t.Errorf("the long stream did not end complete:\n%s", body)
		}
	case <-time.After(5 * time.Second):
		t.Error("the long stream did not end")
	}
	if n := most.Load(); n > 1 {
		t.Errorf("the engine ran %d requests at once; the root's maxConcurrency is 1", n)
	}
}

// startStream posts body to url and returns the lane the answer says it
// took, once its headers came, and the answer, once it ended (or the
// error).
func startStream(url, body string) (lane string, answer <-chan string) {
	lanes, answers := make(chan string, 1), make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", url, bytes.NewReader([]byte(body)))
		req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			lanes <- ""
			answers <- err.Error()
			return
		}
		defer func() { _ = res.Body.Close() }()
		lanes <- res.Header.Get(gateway.HeaderLane)
		b, _ := io.ReadAll(res.Body)
		answers <- string(b)
	}()
	return <-lanes, answers
}
