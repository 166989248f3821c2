package sim

// One generation: admission, fault injection, pacing and the answer,
// streamed (SSE) or whole.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// generation is a validated request, whichever endpoint it came from.
type generation struct {
	chat         bool
	model        string
	seeds        []uint64 // one per choice
	promptTokens int
	// prompts are the prompts' tokens, for the prefix cache.
	prompts      [][]string
	maxTokens    int // 0: not set
	minTokens    int
	ignoreEOS    bool
	stream       bool
	includeUsage bool
}

// plan is the outcome decided before any output: how long each choice is.
func (g *generation) length(natural int) (int, string) {
	n := natural
	if g.ignoreEOS && g.maxTokens > 0 {
		n = g.maxTokens
	}
	n = max(n, g.minTokens)
	if g.maxTokens > 0 && g.maxTokens < n {
		return g.maxTokens, "length"
	}
	if g.ignoreEOS && g.maxTokens > 0 {
		return n, "length"
	}
	return n, "stop"
}

// errAborted ends a handler by dropping the connection.
var errAborted = http.ErrAbortHandler

// generate runs one generation: admission, fault injection, pacing and
// writing the answer in the requested format.
func (s *Simulator) generate(w http.ResponseWriter, r *http.Request, g *generation) {
	arrived := time.Now()
	if g.promptTokens >= s.cfg.MaxModelLen || (g.maxTokens > 0 && g.promptTokens+g.maxTokens > s.cfg.MaxModelLen) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			s.cfg.MaxModelLen, g.promptTokens+g.maxTokens, g.promptTokens, g.maxTokens))
		return
	}
	if g.maxTokens < 0 {
		writeError(w, http.StatusBadRequest, "max_tokens must be at least 1")
		return
	}
	if err := s.enter(); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	defer s.leave()
	ctx := r.Context()

	f := s.cfg.Faults
	if f.ErrorRate > 0 && s.rand() < f.ErrorRate {
		s.m.faults.WithLabelValues("error").Inc()
		writeError(w, f.ErrorStatus, "injected engine error")
		return
	}

	// Admission: wait for a sequence slot, like vLLM's scheduler.
	s.m.waiting.Inc()
	select {
	case s.slots <- struct{}{}:
		s.m.waiting.Dec()
	case <-ctx.Done():
		s.m.waiting.Dec()
		return
	}
	s.m.running.Inc()
	s.m.kvCacheUsage.Set(float64(len(s.slots)) / float64(cap(s.slots)))
	defer func() {
		<-s.slots
		s.m.running.Dec()
		s.m.kvCacheUsage.Set(float64(len(s.slots)) / float64(cap(s.slots)))
	}()
	s.m.queueTime.Observe(time.Since(arrived).Seconds())
	s.m.promptTokens.Add(float64(g.promptTokens))
	cached := 0
	for _, p := range g.prompts {
		cached += s.prefix.admit(p)
	}
	if s.prefix != nil {
		s.m.prefixQueries.Add(float64(g.promptTokens))
		s.m.prefixHits.Add(float64(cached))
		s.m.prefixCached.Set(float64(s.prefix.cachedTokens()))
	}
	// The prompt's uncached tokens are prefilled after the prompts
	// queued before them; the first token follows TimeToFirstToken later.
	now := time.Now()
	firstToken := s.prefill.reserve(now, g.promptTokens-cached).Sub(now) + s.cfg.TimeToFirstToken

	if f.HangRate > 0 && s.rand() < f.HangRate {
		s.m.faults.WithLabelValues("hang").Inc()
		select {
		case <-ctx.Done():
		case <-s.stopping:
		}
		panic(errAborted)
	}
	crashAt := -1
	if f.CrashRate > 0 && s.rand() < f.CrashRate {
		crashAt = f.CrashAfterTokens
	}

	out := &output{s: s, g: g, w: w, arrived: arrived, crashAt: crashAt, created: time.Now().Unix(), firstToken: firstToken}
	if s.prefix != nil {
		out.cached = &promptTokensDetails{CachedTokens: cached}
	}
	if g.chat {
		out.id = s.newID("chatcmpl-")
	} else {
		out.id = s.newID("cmpl-")
	}
	if err := out.run(ctx); err != nil {
		if errors.Is(err, errAborted) {
			panic(errAborted)
		}
		return // the client went away
	}
	s.m.e2e.Observe(time.Since(arrived).Seconds())
}

// crash records an injected crash and aborts the connection.
func (s *Simulator) crash() {
	s.m.faults.WithLabelValues("crash").Inc()
	if s.cfg.Faults.CrashExits {
		s.crashOne.Do(func() { close(s.crashed) })
	}
	s.log.Warn("injected engine crash")
}

// output paces and writes one generation.
type output struct {
	s       *Simulator
	g       *generation
	w       http.ResponseWriter
	id      string
	created int64
	arrived time.Time
	crashAt int // tokens before a crash, -1 for none
	// firstToken is the delay before the first token: prefill and
	// TimeToFirstToken.
	firstToken time.Duration
	cached     *promptTokensDetails // nil without a prefix cache

	gens     []*textGen
	lengths  []int
	finish   []string
	texts    [][]byte
	produced int // generated tokens, all choices
}

func (o *output) run(ctx context.Context) error {
	g := o.g
	steps := 0
	for _, seed := range g.seeds {
		n, reason := g.length(o.s.cfg.OutputTokens)
		o.gens = append(o.gens, newTextGen(seed))
		o.lengths = append(o.lengths, n)
		o.finish = append(o.finish, reason)
		var text []byte
		if !g.stream {
			text = make([]byte, 0, min(8*n, 64<<10)) // about a word per token
		}
		o.texts = append(o.texts, text)
		steps = max(steps, n)
	}
	var sse *sseWriter
	if g.stream {
		// The headers go out at once, as vLLM's do; the first chunk waits
		// for the prefill.
		sse = newSSEWriter(o.w)
		sse.flush()
	}
	last := time.Now()
	for step := range steps {
		if o.crashAt >= 0 && step >= o.crashAt {
			o.s.crash()
			return errAborted
		}
		delay := o.s.cfg.InterTokenLatency
		if step == 0 {
			delay = o.firstToken
		}
		if err := sleep(ctx, delay); err != nil {
			return err
		}
		now := time.Now()
		if step == 0 {
			o.s.m.ttft.Observe(now.Sub(o.arrived).Seconds())
		} else {
			o.s.m.itl.Observe(now.Sub(last).Seconds())
		}
		last = now
		for i, gen := range o.gens {
			if step >= o.lengths[i] {
				continue
			}
			o.produced++
			if sse == nil {
				o.texts[i] = gen.appendNext(o.texts[i])
				continue
			}
			if step == 0 && g.chat {
				// vLLM opens every choice with the assistant role, in the
				// first chunk it sends after the prefill (its first
				// iteration of the engine's outputs), right before the
				// first token.
				sse.event(o.chatChunk(i, chatDelta{Role: "assistant"}, nil))
			}
			tok := gen.next()
			var finish *string
			if step == o.lengths[i]-1 {
				finish = &o.finish[i]
			}
			if g.chat {
				sse.event(o.chatChunk(i, chatDelta{Content: tok}, finish))
			} else {
				sse.event(o.completionChunk(i, tok, finish))
			}
		}
		o.s.m.generatedTokens.Add(float64(len(o.gens)))
		if sse != nil {
			sse.flush()
		}
	}
	if o.crashAt >= 0 {
		o.s.crash()
		return errAborted
	}
	for _, reason := range o.finish {
		o.s.m.success.WithLabelValues(reason).Inc()
	}
	u := usage{PromptTokens: g.promptTokens, CompletionTokens: o.produced, TotalTokens: g.promptTokens + o.produced, PromptTokensDetails: o.cached}
	if sse != nil {
		if g.includeUsage {
			if g.chat {
				sse.event(chatChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: g.model, Choices: []chatChunkChoice{}, Usage: &u})
			} else {
				sse.event(completionResponse{ID: o.id, Object: "text_completion", Created: o.created, Model: g.model, Choices: []completionChoice{}, Usage: &u})
			}
		}
		sse.done()
		return nil
	}
	if g.chat {
		resp := chatResponse{ID: o.id, Object: "chat.completion", Created: o.created, Model: g.model, Usage: u}
		for i := range o.gens {
			resp.Choices = append(resp.Choices, chatChoice{
				Index:        i,
				Message:      chatResponseMessage{Role: "assistant", Content: string(o.texts[i]), ToolCalls: []any{}},
				FinishReason: o.finish[i],
			})
		}
		writeJSON(o.w, http.StatusOK, resp)
		return nil
	}
	resp := completionResponse{ID: o.id, Object: "text_completion", Created: o.created, Model: g.model, Usage: &u}
	for i := range o.gens {
		resp.Choices = append(resp.Choices, completionChoice{Index: i, Text: string(o.texts[i]), FinishReason: &o.finish[i]})
	}
	writeJSON(o.w, http.StatusOK, resp)
	return nil
}

func (o *output) chatChunk(i int, d chatDelta, finish *string) chatChunk {
	c := chatChunkChoice{Index: i, Delta: d, FinishReason: finish}
	if finish != nil {
		c.StopReason = json.RawMessage("null")
	}
	return chatChunk{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.g.model, Choices: []chatChunkChoice{c}}
}

func (o *output) completionChunk(i int, text string, finish *string) completionResponse {
	return completionResponse{ID: o.id, Object: "text_completion", Created: o.created, Model: o.g.model,
		Choices: []completionChoice{{Index: i, Text: text, FinishReason: finish}}}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
