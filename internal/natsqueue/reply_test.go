package natsqueue

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/model-orchestra/operator/internal/queue"
)

// msg builds a response message; seq < 0 means no data message.
func msg(kind string, attempt, seq int, data string, first, end bool) *nats.Msg {
	m := &nats.Msg{Header: nats.Header{}, Data: []byte(data)}
	m.Header.Set(HeaderKind, kind)
	m.Header.Set(HeaderAttempt, strconv.Itoa(attempt))
	if kind == KindData {
		m.Header.Set(HeaderSeq, strconv.Itoa(seq))
	}
	if first {
		m.Header.Set(HeaderStatus, "200")
		m.Header.Set(HeaderContentType, "text/event-stream")
	}
	if end {
		m.Header.Set(HeaderEnd, "1")
	}
	return m
}

func testReply(stream bool, stall time.Duration) *reply {
	c := &Client{
		cfg:      ClientConfig{StallTimeout: stall, RedeliveryWait: stall},
		log:      slog.New(slog.DiscardHandler),
		replies:  map[string]*reply{},
		appAlive: map[string]time.Time{},
	}
	return newReply(c, queue.Job{ID: "j", App: "chat", Stream: stream}, "j")
}

// drain reads r to the end and returns the chunk data and the final error.
func drain(r *reply) ([]string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var got []string
	for {
		c, err := r.Next(ctx)
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, string(c.Data))
	}
}

func TestReplyAssembly(t *testing.T) {
	tests := []struct {
		name    string
		stream  bool
		msgs    []*nats.Msg
		want    []string
		wantErr error
	}{
		{
			name:   "streamed chunks in order; heartbeats and the empty end are invisible",
			stream: true,
			msgs: []*nats.Msg{
				msg(KindAccepted, 1, -1, "", false, false),
				msg(KindData, 1, 0, "a", true, false),
				msg(KindHeartbeat, 1, -1, "", false, false),
				msg(KindData, 1, 1, "b", false, false),
				msg(KindData, 1, 2, "", false, true),
			},
			want: []string{"a", "b"},
		},
		{
			name:   "non-streamed answer is one chunk, and a retry replaces a half-received attempt",
			stream: false,
			msgs: []*nats.Msg{
				msg(KindData, 1, 0, "half", true, false),
				msg(KindData, 2, 0, "who", true, false),
				msg(KindData, 1, 1, "stale", false, true),
				msg(KindData, 2, 1, "le", false, true),
			},
			want: []string{"whole"},
		},
		{
			name:   "a streamed retry before any data is transparent",
			stream: true,
			msgs: []*nats.Msg{
				msg(KindData, 1, 0, "", true, false),
				msg(KindData, 2, 0, "x", true, false),
				msg(KindData, 2, 1, "", false, true),
			},
			want: []string{"x"},
		},
		{
			name:   "a streamed retry after data is an error",
			stream: true,
			msgs: []*nats.Msg{
				msg(KindData, 1, 0, "x", true, false),
				msg(KindAccepted, 2, -1, "", false, false),
			},
			want:    []string{"x"},
			wantErr: queue.ErrRetriedAfterPartial,
		},
		{
			name:   "a gap is filled by the resent messages; duplicates are dropped",
			stream: false,
			msgs: []*nats.Msg{
				msg(KindData, 1, 0, "x", true, false),
				msg(KindData, 1, 2, "z", false, true),
				msg(KindData, 1, 1, "y", false, false),
				msg(KindData, 1, 2, "z", false, true),
			},
			want: []string{"xyz"},
		},
		{
			name:   "a streamed gap too, in order",
			stream: true,
			msgs: []*nats.Msg{
				msg(KindData, 1, 0, "x", true, false),
				msg(KindData, 1, 2, "z", false, false),
				msg(KindData, 1, 3, "", false, true),
				msg(KindData, 1, 0, "x", true, false),
				msg(KindData, 1, 1, "y", false, false),
				msg(KindData, 1, 2, "z", false, false),
			},
			want: []string{"x", "y", "z"},
		},
		{
			name:    "dead letter",
			stream:  true,
			msgs:    []*nats.Msg{msg(KindDeadLettered, 3, -1, "", false, false)},
			wantErr: queue.ErrDeadLettered,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := testReply(tt.stream, time.Minute)
			for _, m := range tt.msgs {
				r.push(m)
			}
			got, err := drain(r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReplyFirstChunkCarriesStatusAndHeaders(t *testing.T) {
	r := testReply(true, time.Minute)
	r.push(msg(KindData, 1, 0, "", true, false))
	r.push(msg(KindData, 1, 1, "data: {}\n\n", false, false))
	c, err := r.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Status != 200 || c.Header.Get("Content-Type") != "text/event-stream" || string(c.Data) != "data: {}\n\n" {
		t.Errorf("first chunk = %+v", c)
	}
}

func TestReplyStalls(t *testing.T) {
	t.Run("no dispatcher at all", func(t *testing.T) {
		r := testReply(false, 100*time.Millisecond)
		if _, err := drain(r); !errors.Is(err, queue.ErrNotServed) {
			t.Fatalf("err = %v, want ErrNotServed", err)
		}
	})
	t.Run("a stream that stops after data", func(t *testing.T) {
		r := testReply(true, 100*time.Millisecond)
		r.push(msg(KindData, 1, 0, "x", true, false))
		r.c.appAlive["chat"] = time.Now().Add(time.Hour) // a dispatcher is around
		if _, err := drain(r); !errors.Is(err, queue.ErrRetriedAfterPartial) {
			t.Fatalf("err = %v, want ErrRetriedAfterPartial", err)
		}
	})
}

func TestReplyToken(t *testing.T) {
	for id, want := range map[string]string{
		"chatcmpl-abc_123": "chatcmpl-abc_123",
		"a.b*c":            "a_2eb_2ac",
	} {
		if got := replyToken(id); got != want {
			t.Errorf("replyToken(%q) = %q, want %q", id, got, want)
		}
		if err := ValidToken(replyToken(id)); err != nil {
			t.Errorf("token of %q is not a subject token: %v", id, err)
		}
	}
}

// TestReplyEndsAtOnceAfterTheLastChunk: the end marker that arrives with the
// last data chunk ends the reply at once, not after a stall-check period
// (it used to wait StallTimeout/4 after data: [DONE]).
func TestReplyEndsAtOnceAfterTheLastChunk(t *testing.T) {
	r := testReply(true, time.Hour)
	r.push(msg(KindData, 1, 0, "data: [DONE]\n\n", true, false))
	r.push(msg(KindData, 1, 1, "", false, true))
	if c, err := r.Next(context.Background()); err != nil || string(c.Data) != "data: [DONE]\n\n" {
		t.Fatalf("Next = %q, %v", c.Data, err)
	}
	select { // the wake-up of the two pushes was spent by the first Next
	case <-r.wake:
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := r.Next(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("Next after the last chunk = %v, want io.EOF at once", err)
	}
}

// Poll hands out the chunks that already arrived, in order, and says so
// without waiting when the next one has not: a heartbeat in the inbox is
// not a chunk.
func TestReplyPollNeverWaits(t *testing.T) {
	r := testReply(true, time.Minute)
	var p queue.Poller = r
	if _, ok, err := p.Poll(); ok || err != nil {
		t.Fatalf("Poll of an empty reply = ok %v, %v; want not ready", ok, err)
	}
	r.push(msg(KindData, 1, 0, "a", true, false))
	r.push(msg(KindHeartbeat, 1, -1, "", false, false))
	r.push(msg(KindData, 1, 1, "b", false, false))
	var got []string
	for {
		c, ok, err := p.Poll()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, string(c.Data))
	}
	if diff := cmp.Diff([]string{"a", "b"}, got); diff != "" {
		t.Fatalf("polled chunks (-want +got):\n%s", diff)
	}
	r.push(msg(KindHeartbeat, 1, -1, "", false, false))
	if _, ok, err := p.Poll(); ok || err != nil {
		t.Fatalf("Poll with only a heartbeat = ok %v, %v; want not ready", ok, err)
	}
	r.push(msg(KindData, 1, 2, "", false, true))
	if _, _, err := p.Poll(); !errors.Is(err, io.EOF) {
		t.Fatalf("Poll after the end = %v; want io.EOF", err)
	}
}
