package dataplanetest_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestDirectLaneBrokenAnswerBeforeTheClientSawIt: an engine that breaks
// off a non-streamed answer on the direct lane costs the client nothing:
// the gateway reads a non-streamed answer whole before sending it, so the
// request is served through the queue instead, with a whole answer, and
// the lease is given back as failed.
func TestDirectLaneBrokenAnswerBeforeTheClientSawIt(t *testing.T) {
	s, d := directStack(t)
	awaitLease(t, s, d)
	queued := laneCount(t, s, "chat", "queue")
	s.Engine.BreakOff.Store(1)
	status, body, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", chatBody, "")
	if status != 200 || !strings.Contains(body, `"usage"`) || strings.Contains(body, "chatcmpl-broken") {
		t.Fatalf("a non-streamed answer the engine broke off: %d %s; want the queue's whole answer", status, body)
	}
	if lane != "queue" {
		t.Errorf("the answer says lane %q, want queue (the lane that answered)", lane)
	}
	if got := laneCount(t, s, "chat", "queue"); got != queued+1 {
		t.Errorf("%v more requests took the queue, want 1", got-queued)
	}
	if got := laneCount(t, s, "chat", "direct"); got != 0 {
		t.Errorf("%v requests counted on the direct lane, want 0", got)
	}
	eventually(t, 5*time.Second, func() error {
		if l := leasesHeld(d); l != 0 {
			return fmt.Errorf("%v leases held after the engine failed on one", l)
		}
		return nil
	})
}

// TestDirectLaneBrokenStream: an engine that breaks off a streamed answer
// on the direct lane after the client saw content ends that stream with
// the queue lane's documented error event (stream_interrupted) and no
// [DONE]: the gateway cannot take back what the client saw. The lease is
// given back as failed, and the next request is served.
func TestDirectLaneBrokenStream(t *testing.T) {
	s, d := directStack(t)
	awaitLease(t, s, d)
	s.Engine.BreakOff.Store(1)
	status, body, lane := sendLane(t, s.Gateway.URL, "/v1/chat/completions", chatStream, "")
	if status != 200 || lane != "direct" {
		t.Fatalf("the broken stream: %d, lane %q; want 200 on the direct lane", status, lane)
	}
	if !strings.Contains(body, `"content":"Hel"`) || !strings.Contains(body, `"code":"stream_interrupted"`) || strings.Contains(body, "[DONE]") {
		t.Errorf("the broken stream ended\n%s\nwant the content sent, then a stream_interrupted error event and no [DONE]", body)
	}
	eventually(t, 5*time.Second, func() error {
		if l := leasesHeld(d); l != 0 {
			return fmt.Errorf("%v leases held after the engine failed on one", l)
		}
		return nil
	})
	if status, body := send(t, s.Gateway.URL, "/v1/chat/completions", chatStream); status != 200 || !strings.Contains(body, "data: [DONE]") {
		t.Errorf("the next request: %d %s", status, body)
	}
}
