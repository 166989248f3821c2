package sim

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/model-orchestra/operator/internal/arena"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 8 << 20

// Simulator is one simulated engine. It is safe for concurrent use.
type Simulator struct {
	cfg     Config
	log     *slog.Logger
	reg     *prometheus.Registry
	m       *metrics
	slots   chan struct{}
	created int64

	idPrefix string
	nextID   atomic.Uint64

	stopOnce sync.Once
	stopping chan struct{} // closed when the simulator stops: hung requests end
	crashed  chan struct{} // closed when a crash with CrashExits happens
	crashOne sync.Once

	// rand draws fault decisions; tests may replace it before serving.
	rand func() float64

	engine engineState
	// device holds the weights with DeviceMemoryPool; nil with
	// DeviceMemoryKernel.
	device *arena.Device

	// prefix is the prefix cache (nil when off); prefill paces prompts.
	prefix  *prefixCache
	prefill prefill
}

// New returns a simulator for cfg, which should have passed Validate. Its
// metrics live in a registry of its own, so several simulators can run in one
// process.
func New(cfg Config, opts ...Option) *Simulator {
	var b [6]byte
	_, _ = rand.Read(b[:])
	s := &Simulator{
		cfg:      cfg,
		log:      slog.Default(),
		reg:      prometheus.NewRegistry(),
		slots:    make(chan struct{}, max(cfg.MaxNumSeqs, 1)),
		created:  time.Now().Unix(),
		idPrefix: hex.EncodeToString(b[:]),
		stopping: make(chan struct{}),
		crashed:  make(chan struct{}),
		rand:     mrand.Float64,
		prefix:   newPrefixCache(cfg.PrefixCache),
		prefill:  prefill{rate: cfg.PrefillRate},
	}
	for _, o := range opts {
		o(s)
	}
	if cfg.DeviceMemory == DeviceMemoryKernel {
		s.device = nil
	} else if s.device == nil {
		s.device = ProcessDevice()
	}
	s.m = newMetrics(s.reg, cfg.Model)
	s.engine.weightsAwake, s.engine.kvAwake, s.engine.loaded = true, true, true
	return s
}

// Option customises a Simulator.
type Option func(*Simulator)

// WithDevice sets the device pool the weights live in with
// DeviceMemoryPool (default: ProcessDevice).
func WithDevice(d *arena.Device) Option { return func(s *Simulator) { s.device = d } }

// processDevice is the device of every simulator of the process that is
// given no other: by default one accelerator per process, with no fixed
// capacity (its regions are mapped as engines load and kept).
var processDevice struct {
	sync.Mutex
	d *arena.Device
}

// ProcessDevice is the device pool the process's simulators share.
func ProcessDevice() *arena.Device {
	processDevice.Lock()
	defer processDevice.Unlock()
	if processDevice.d == nil {
		processDevice.d = arena.NewDevice(0)
	}
	return processDevice.d
}

// OpenProcessDevice makes the device file cfg.DeviceFile names, if any,
// the process's device pool, its regions named after cfg.Model.
func OpenProcessDevice(cfg Config) error {
	if cfg.DeviceFile == "" {
		return nil
	}
	d, err := arena.OpenSharedDevice(cfg.DeviceFile, cfg.DeviceCapacity, cfg.Model)
	if err != nil {
		return fmt.Errorf("opening the shared device: %w", err)
	}
	UseProcessDevice(d)
	return nil
}

// UseProcessDevice makes d the process's device pool, for example a
// device shared by the engine containers of a seat-group pod
// (orchestra-sim --device-file, arena.OpenSharedDevice). Call it before
// the first New.
func UseProcessDevice(d *arena.Device) {
	processDevice.Lock()
	defer processDevice.Unlock()
	processDevice.d = d
}

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(s *Simulator) { s.log = l } }

// Handler returns the HTTP API: the OpenAI endpoints, /health, /version,
// /metrics and /orchestra/weights; with sleep mode also vLLM's /sleep,
// /wake_up, /is_sleeping and /collective_rpc.
func (s *Simulator) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.chatCompletions)
	mux.HandleFunc("POST /v1/completions", s.completions)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "orchestra-sim"})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /orchestra/weights", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, s.WeightsStatus())
	})
	if s.cfg.Sleep.Enabled {
		s.sleepHandlers(mux)
	}
	return mux
}

// Crashed is closed when an injected crash with Faults.CrashExits happened.
func (s *Simulator) Crashed() <-chan struct{} { return s.crashed }

// Stop ends hung requests. Run calls it on shutdown.
func (s *Simulator) Stop() { s.stopOnce.Do(func() { close(s.stopping) }) }

func (s *Simulator) newID(prefix string) string {
	return prefix + s.idPrefix + strconv.FormatUint(s.nextID.Add(1), 16)
}

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

func (s *Simulator) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !s.decode(w, r, &req) {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages must not be empty")
		return
	}
	g := &generation{chat: true, model: req.Model, stream: req.Stream, ignoreEOS: req.IgnoreEOS, minTokens: req.MinTokens}
	if req.StreamOptions != nil {
		g.includeUsage = req.StreamOptions.IncludeUsage
	}
	switch {
	case req.MaxCompletionTokens != nil:
		g.maxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		g.maxTokens = *req.MaxTokens
	}
	parts := make([]string, 0, 2*len(req.Messages)+1)
	for _, m := range req.Messages {
		text := m.text()
		parts = append(parts, m.Role, text)
		g.promptTokens += countTokens(text) + 4 // role and template tokens
	}
	if req.Seed != nil {
		parts = append(parts, strconv.FormatInt(*req.Seed, 10))
	}
	if s.prefix != nil || s.prefill.rate > 0 {
		g.prompts = [][]string{chatTokens(req.Messages)}
	}
	n, ok := choices(w, req.N)
	if !ok {
		return
	}
	for i := range n {
		g.seeds = append(g.seeds, seedOf(append(parts, strconv.Itoa(i))...))
	}
	s.generate(w, r, g)
}

func (s *Simulator) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !s.decode(w, r, &req) {
		return
	}
	texts, tokens, toks, err := req.prompts()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	g := &generation{model: req.Model, stream: req.Stream, ignoreEOS: req.IgnoreEOS, minTokens: req.MinTokens}
	if req.StreamOptions != nil {
		g.includeUsage = req.StreamOptions.IncludeUsage
	}
	if req.MaxTokens != nil {
		g.maxTokens = *req.MaxTokens
	} else {
		g.maxTokens = 16 // the OpenAI default for completions
	}
	n, ok := choices(w, req.N)
	if !ok {
		return
	}
	for p, text := range texts {
		if s.prefix != nil || s.prefill.rate > 0 {
			g.prompts = append(g.prompts, toks[p])
		}
		g.promptTokens += tokens[p] * n
		for i := range n {
			var seed []string
			if req.Seed != nil {
				seed = []string{strconv.FormatInt(*req.Seed, 10)}
			}
			g.seeds = append(g.seeds, seedOf(append([]string{"prompt", text, strconv.Itoa(i)}, seed...)...))
		}
	}
	g.promptTokens /= n
	s.generate(w, r, g)
}

func choices(w http.ResponseWriter, n *int) (int, bool) {
	if n == nil {
		return 1, true
	}
	if *n < 1 || *n > 16 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("n must be between 1 and 16, got %d", *n))
		return 0, false
	}
	return *n, true
}

// decode reads a JSON body and checks the model name.
func (s *Simulator) decode(w http.ResponseWriter, r *http.Request, v interface{ model() *string }) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading request body: %v", err))
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return false
	}
	m := v.model()
	if *m == "" {
		*m = s.cfg.Model
	}
	if *m != s.cfg.Model {
		writeErrorType(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", *m))
		return false
	}
	return true
}

func (r *chatRequest) model() *string       { return &r.Model }
func (r *completionRequest) model() *string { return &r.Model }
func (r *embeddingRequest) model() *string  { return &r.Model }

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

func (s *Simulator) embeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	if !s.decode(w, r, &req) {
		return
	}
	var inputs []string
	var tokens int
	var one string
	var many []string
	var ids []int
	var idLists [][]int
	switch {
	case json.Unmarshal(req.Input, &one) == nil:
		inputs, tokens = []string{one}, countTokens(one)
	case json.Unmarshal(req.Input, &many) == nil && len(many) > 0:
		inputs = many
		for _, in := range many {
			tokens += countTokens(in)
		}
	case json.Unmarshal(req.Input, &ids) == nil && len(ids) > 0:
		inputs, tokens = []string{string(req.Input)}, len(ids)
	case json.Unmarshal(req.Input, &idLists) == nil && len(idLists) > 0:
		for _, l := range idLists {
			enc, _ := json.Marshal(l)
			inputs = append(inputs, string(enc))
			tokens += len(l)
		}
	default:
		writeError(w, http.StatusBadRequest, "input must be a string, a list of strings or token ids")
		return
	}
	dim := s.cfg.EmbeddingDim
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > s.cfg.EmbeddingDim {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("dimensions must be between 1 and %d", s.cfg.EmbeddingDim))
			return
		}
		dim = *req.Dimensions
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported encoding_format %q", req.EncodingFormat))
		return
	}
	if err := s.enter(); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	defer s.leave()
	s.m.promptTokens.Add(float64(tokens))
	resp := embeddingResponse{ID: s.newID("embd-"), Object: "list", Created: time.Now().Unix(), Model: req.Model,
		Usage: usage{PromptTokens: tokens, TotalTokens: tokens}}
	for i, in := range inputs {
		v := embedding(in, dim)
		d := embeddingData{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			d.Embedding = base64.StdEncoding.EncodeToString(float32sLE(v))
		}
		resp.Data = append(resp.Data, d)
	}
	s.m.success.WithLabelValues("stop").Inc()
	writeJSON(w, http.StatusOK, resp)
}

func (s *Simulator) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "vllm", Root: s.cfg.Model,
		MaxModelLen: s.cfg.MaxModelLen, Permission: []any{},
	}}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding response","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	typ := "BadRequestError"
	if status >= 500 {
		typ = "InternalServerError"
	}
	writeErrorType(w, status, typ, msg)
}

func writeErrorType(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, errorBody{Error: errorDetail{Message: msg, Type: typ, Code: status}})
}

// sseWriter writes server-sent events the way vLLM does.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *sseWriter) event(v any) {
	s.buf = append(s.buf, "data: "...)
	b, _ := json.Marshal(v)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, "\n\n"...)
}

func (s *sseWriter) flush() {
	_, _ = s.w.Write(s.buf)
	s.buf = s.buf[:0]
	_ = s.rc.Flush()
}

func (s *sseWriter) done() {
	s.buf = append(s.buf, "data: [DONE]\n\n"...)
	s.flush()
}
