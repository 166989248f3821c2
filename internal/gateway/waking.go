package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/queue"
)

// WakeStates tells the gateway which applications are waking: scaled to
// zero by their lifecycle, with pods starting because requests arrived
// (internal/lifecyclestate.States implements it from the lifecycle bucket).
type WakeStates interface {
	// Waking reports whether requests for app wait for its pods to start,
	// and why the wake does not progress when the lifecycle knows.
	Waking(app string) (waking bool, problem string)
}

// wakeCheck paces the checks of a waiting request against its
// application's state and maxWait.
const wakeCheck = 250 * time.Millisecond

// firstFunc returns the first chunk of an answer.
type firstFunc func(ctx context.Context, w http.ResponseWriter, x *exchange) (queue.Chunk, error)

// waitFirst returns how the first chunk of model's answer is awaited. A
// request for an application with a lifecycle may wait for it to wake:
// while it does, a streamed request gets its response headers and an SSE
// comment every WakeKeepAlive, so that clients with short read timeouts
// keep waiting, and past maxWait the request fails with 503
// model_waking_timeout and is removed from the queue (by the reply's
// Close). A request whose application is awake waits as any other: the
// queue's own bounds apply.
func (g *Gateway) waitFirst(model *ModelConfig, reply queue.Reply) firstFunc {
	if g.wake == nil || model.MaxWait.Duration <= 0 {
		return func(ctx context.Context, _ http.ResponseWriter, _ *exchange) (queue.Chunk, error) {
			return reply.Next(ctx)
		}
	}
	return func(ctx context.Context, w http.ResponseWriter, x *exchange) (queue.Chunk, error) {
		return g.awaitWake(ctx, w, x, model, reply)
	}
}

type nextResult struct {
	chunk queue.Chunk
	err   error
}

func (g *Gateway) awaitWake(ctx context.Context, w http.ResponseWriter, x *exchange, model *ModelConfig, reply queue.Reply) (queue.Chunk, error) {
	nctx, stop := context.WithCancel(ctx)
	defer stop()
	got := make(chan nextResult, 1)
	go func() {
		c, err := reply.Next(nctx)
		got <- nextResult{c, err}
	}()
	deadline := x.start.Add(model.MaxWait.Duration)
	check := time.NewTicker(wakeCheck)
	defer check.Stop()
	every := g.cfg.Timeouts.WakeKeepAlive.Duration
	if every <= 0 {
		every = 5 * time.Second
	}
	var (
		lastBeat  time.Time
		lastSaid  string
		wakeStart time.Time // zero until the request waits for a wake
	)
	waiting := g.metrics.wakeWaiting.WithLabelValues(model.Name)
	// ended records a wait for a wake: its duration in the metrics, the
	// X-Orchestra-Wake-Wait header of a non-streamed answer, and a last
	// comment in a stream when the answer came.
	ended := func(answered bool) {
		if wakeStart.IsZero() {
			return
		}
		waited := time.Since(wakeStart)
		waiting.Dec()
		g.metrics.wakeWait.WithLabelValues(model.Name).Observe(waited.Seconds())
		if !x.stream {
			w.Header().Set(headerWakeWait, strconv.FormatFloat(waited.Seconds(), 'f', 3, 64))
			return
		}
		if answered && x.started {
			_ = g.comment(w, x, fmt.Sprintf("model %s is ready after %s", model.Name, roundSeconds(waited)))
		}
	}
	for {
		waking, problem := g.wake.Waking(model.App)
		now := time.Now()
		if waking && wakeStart.IsZero() {
			wakeStart = now
			waiting.Inc()
		}
		if waking && x.stream {
			said := g.wakeProgress(model, problem, now.Sub(x.start))
			// Say each change at once, and repeat it every keep-alive period.
			if progressKey(said) != progressKey(lastSaid) || now.Sub(lastBeat) >= every {
				if err := g.comment(w, x, said); err != nil {
					ended(false)
					return queue.Chunk{}, err
				}
				lastBeat, lastSaid = now, said
			}
		}
		if waking && now.After(deadline) {
			stop()
			r := <-got
			if r.err == nil {
				ended(true)
				return r.chunk, nil // the answer won the race: never drop it
			}
			ended(false)
			g.logger.Warn("request waited longer than maxWait for its model to wake", "request_id", x.id, "model", model.Name, "app", model.App, "maxWait", model.MaxWait.Duration, "problem", problem)
			return queue.Chunk{}, modelWakingTimeout(model.Name, model.MaxWait.Duration, problem)
		}
		select {
		case r := <-got:
			ended(r.err == nil)
			return r.chunk, r.err
		case <-check.C:
		}
	}
}

// headerWakeWait is the response header of a non-streamed request that
// waited for its model to wake: the seconds it waited.
const headerWakeWait = "X-Orchestra-Wake-Wait"

// WakeStatuses is implemented by WakeStates that know the lifecycle status
// of an application (lifecycle.States): the progress comments then say
// what the wake is doing.
type WakeStatuses interface {
	Lookup(app string) (v1alpha1.LifecycleStatus, bool)
}

// wakeProgress describes a wake for an SSE comment, which SDKs ignore and
// curl users read: "waiting for model M to wake: <what happens> (Ns so
// far[, expected Es])", or why it cannot start.
func (g *Gateway) wakeProgress(model *ModelConfig, problem string, waited time.Duration) string {
	what := "queued"
	var expected string
	if ws, ok := g.wake.(WakeStatuses); ok {
		if st, ok := ws.Lookup(model.App); ok {
			switch st.State {
			case v1alpha1.LifecycleZero:
				what = "queued; the application is scaled to zero, its pods are being started"
			case v1alpha1.LifecycleAsleep:
				what = "queued; the engine is asleep and is being woken"
				if st.ResidentTier != "" {
					what += ", its weights restored from the " + string(st.ResidentTier) + " tier"
				}
			case v1alpha1.LifecycleWaking:
				what = "the pods are starting and the model is loading"
				if st.LastWake != nil && st.LastWake.FromTier != "" {
					what += " from the " + string(st.LastWake.FromTier) + " tier"
				}
			case v1alpha1.LifecycleDraining:
				what = "queued; the application is finishing its sleep before it wakes"
			}
			expected = st.ExpectedResumeSeconds
		}
	}
	if g.pods != nil {
		if pods := g.pods.PodProgress(model.App); pods != "" {
			what += "; " + pods
		}
	}
	msg := fmt.Sprintf("waiting for model %s to wake: %s (%s so far", model.Name, what, roundSeconds(waited))
	if expected != "" {
		msg += ", expected " + expected + " s"
	}
	msg += ")"
	if problem != "" {
		msg += "; it cannot start: " + problem
	}
	return msg
}

// PodProgress says how far an application's pods are on their way to
// serving, in a sentence ("pod x is scheduled on node n; starting container
// engine (ContainerCreating)"), or "" when nothing recent is known.
// natsqueue.WakeProgress implements it from what the dispatchers see.
type PodProgress interface {
	PodProgress(app string) string
}

// progressKey is a progress comment without its running time, to tell a
// change of what happens from the clock ticking.
func progressKey(said string) string {
	if i := strings.Index(said, " ("); i >= 0 {
		j := strings.Index(said[i:], ")")
		if j >= 0 {
			return said[:i] + said[i+j+1:]
		}
	}
	return said
}

// roundSeconds formats d as seconds with one decimal.
func roundSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
}

// startStream sends the headers of a streamed (SSE) answer, once: the
// first of the keep-alive comments, the chat stream and the Responses API
// stream to start the answer does it.
func startStream(w http.ResponseWriter, x *exchange) {
	if x.started {
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	x.status, x.started = http.StatusOK, true
	w.WriteHeader(http.StatusOK)
}

// comment starts a streamed response, if not yet started, and sends one
// SSE comment line, which clients ignore.
func (g *Gateway) comment(w http.ResponseWriter, x *exchange, text string) error {
	startStream(w, x)
	if _, err := io.WriteString(w, ": "+strings.ReplaceAll(text, "\n", " ")+"\n\n"); err != nil {
		return errClientGone
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		return errClientGone
	}
	return nil
}

// refusalInStream sends an engine's refusal of a streamed request whose
// headers were already sent as keep-alives: its JSON error as one SSE
// event, without [DONE].
func refusalInStream(ctx context.Context, w http.ResponseWriter, reply queue.Reply, x *exchange, head queue.Chunk) error {
	var body bytes.Buffer
	if err := readRefusal(ctx, reply, head, &body); err != nil {
		return err
	}
	var ev []byte
	for line := range bytes.Lines(bytes.TrimSpace(body.Bytes())) {
		ev = append(append(ev, "data: "...), bytes.TrimRight(line, "\r\n")...)
		ev = append(ev, '\n')
	}
	ev = append(ev, '\n')
	x.status = head.Status
	if _, err := w.Write(ev); err != nil {
		return errClientGone
	}
	_ = http.NewResponseController(w).Flush()
	return nil
}
