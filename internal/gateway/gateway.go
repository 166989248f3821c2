// Package gateway is the OpenAI-compatible front door of a model orchestra.
// It authenticates API tokens held in Kubernetes Secrets, applies per-token
// limits, validates and routes each request by its served model name to an
// application, hands it to the queue, and streams the engine's answer back
// (server-sent events for streams) while counting tokens from the usage.
package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/model-orchestra/operator/internal/enginecall"
	"github.com/model-orchestra/operator/internal/queue"
)

// Pinger is implemented by queues that can report whether they are
// reachable; /readyz uses it when the queue has it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Options are the gateway's collaborators besides its queue.
type Options struct {
	// Tokens authenticates bearer tokens. It may be nil only when
	// cfg.Auth.Anonymous is true.
	Tokens TokenSource
	// Logger receives access logs and events. Nil discards them.
	Logger *slog.Logger
	// Wake tells which applications are waking; nil: none ever is
	// (waking.go).
	Wake WakeStates
	// Responses keeps stored Responses API responses (store: true); nil:
	// responses are never stored (their store field says false).
	Responses ResponseStore
	// Batches serves the Files and Batch APIs; nil: they answer 404.
	Batches Batches
	// Pods says how far a waking application's pods are, for the wake
	// progress comments (waking.go); nil: the comments say the state only.
	Pods PodProgress
	// Serving tells the direct lane (direct.go) whether an application
	// with a lifecycle serves; nil: taken from Wake when it implements
	// ServingStates, else such applications never take the direct lane.
	Serving ServingStates
}

// Gateway serves the OpenAI API in front of a queue.
type Gateway struct {
	cfg    Config
	queue  queue.Queue
	tokens TokenSource
	logger *slog.Logger
	wake   WakeStates
	// responses keeps stored responses; nil: none are stored.
	responses ResponseStore
	batches   Batches
	pods      PodProgress
	models    map[string]*ModelConfig
	anon      *Principal
	limiter   limiter
	metrics   *metrics
	created   int64
	draining  atomic.Bool
	// lanes holds the direct lanes; nil when the queue lends no slots.
	lanes *lanes
	// active counts inference requests being served, so that a hard stop
	// can wait for their replies to be closed.
	active sync.WaitGroup

	api http.Handler
	ops http.Handler
}

// New builds a gateway. cfg must be valid (see Config.Validate).
func New(cfg Config, q queue.Queue, opts Options) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	if q == nil {
		return nil, errors.New("gateway needs a queue")
	}
	if opts.Tokens == nil && !cfg.Auth.Anonymous {
		return nil, errors.New("gateway needs a token source unless auth.anonymous is true")
	}
	if err := checkBodyLimit(cfg.Limits.MaxBodyBytes, q); err != nil {
		return nil, err
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{
		cfg:       cfg,
		queue:     q,
		tokens:    opts.Tokens,
		logger:    logger,
		wake:      opts.Wake,
		responses: opts.Responses,
		batches:   opts.Batches,
		pods:      opts.Pods,
		models:    make(map[string]*ModelConfig, len(cfg.Models)),
		anon:      &Principal{Name: "anonymous", Limits: cfg.Limits.Default},
		limiter:   limiter{now: time.Now},
		metrics:   newMetrics(),
		created:   time.Now().Unix(),
	}
	if leaser, ok := q.(queue.Leaser); ok {
		serving := opts.Serving
		if serving == nil {
			serving, _ = opts.Wake.(ServingStates)
		}
		idle := cfg.Direct.LeaseIdle.Duration
		if idle <= 0 {
			idle = DefaultLeaseIdle
		}
		g.lanes = &lanes{leaser: leaser, serving: serving, idle: idle, engines: enginecall.NewTransport(),
			now: time.Now, byApp: map[string]*lane{}}
	}
	g.cfg.Models = slices.Clone(cfg.Models) // defaults are filled in below
	for i := range g.cfg.Models {
		m := &g.cfg.Models[i]
		if m.OwnedBy == "" {
			m.OwnedBy = "model-orchestra"
		}
		g.models[m.Name] = m
	}
	if c, ok := opts.Batches.(interface{ Collectors() []prometheus.Collector }); ok {
		g.metrics.registry.MustRegister(c.Collectors()...)
	}
	if st, ok := opts.Tokens.(*SecretTokens); ok {
		st.notify(func(n int) { g.metrics.apiTokens.Set(float64(n)) })
	}

	api := http.NewServeMux()
	api.HandleFunc("POST /v1/chat/completions", g.inference(endpointChat))
	api.HandleFunc("POST /v1/completions", g.inference(endpointCompletions))
	api.HandleFunc("POST /v1/embeddings", g.inference(endpointEmbeddings))
	api.HandleFunc("POST /v1/responses", g.inference(endpointResponses))
	api.HandleFunc("GET /v1/responses/{id}", g.storedResponse(g.getResponse))
	api.HandleFunc("DELETE /v1/responses/{id}", g.storedResponse(g.deleteResponse))
	api.HandleFunc("GET /v1/responses/{id}/input_items", g.storedResponse(g.responseInputItems))
	api.HandleFunc("POST /v1/files", g.batchAPI(endpointFiles, g.uploadFile))
	api.HandleFunc("GET /v1/files", g.batchAPI(endpointFiles, g.listFiles))
	api.HandleFunc("GET /v1/files/{id}", g.batchAPI(endpointFiles, g.getFile))
	api.HandleFunc("GET /v1/files/{id}/content", g.batchAPI(endpointFiles, g.fileContent))
	api.HandleFunc("DELETE /v1/files/{id}", g.batchAPI(endpointFiles, g.deleteFile))
	api.HandleFunc("POST /v1/batches", g.batchAPI(endpointBatches, g.createBatch))
	api.HandleFunc("GET /v1/batches", g.batchAPI(endpointBatches, g.listBatches))
	api.HandleFunc("GET /v1/batches/{id}", g.batchAPI(endpointBatches, g.getBatch))
	api.HandleFunc("POST /v1/batches/{id}/cancel", g.batchAPI(endpointBatches, g.cancelBatch))
	api.HandleFunc("GET /v1/models", g.listModels)
	api.HandleFunc("GET /v1/models/{model...}", g.getModel)
	api.HandleFunc("GET /healthz", g.healthz)
	api.HandleFunc("GET /readyz", g.readyz)
	api.HandleFunc("/", g.notFound)
	g.api = g.front(api)

	ops := http.NewServeMux()
	ops.Handle("GET /metrics", promhttp.HandlerFor(g.metrics.registry, promhttp.HandlerOpts{}))
	ops.HandleFunc("GET /healthz", g.healthz)
	ops.HandleFunc("GET /readyz", g.readyz)
	g.ops = ops
	return g, nil
}

// checkBodyLimit fails when the queue cannot carry a body of
// limits.maxBodyBytes: such bodies would be accepted and then refused by the
// queue. A queue that does not know its limit yet (not connected) is
// checked again on every Submit, which answers 413 for a body it cannot
// carry.
func checkBodyLimit(maxBody int64, q queue.Queue) error {
	sl, ok := q.(queue.SizeLimiter)
	if !ok {
		return nil
	}
	if qmax := sl.MaxBodyBytes(); qmax > 0 && maxBody > qmax {
		return fmt.Errorf("limits.maxBodyBytes is %d but the queue carries bodies of at most %d bytes "+
			"(NATS max_payload minus room for headers): lower limits.maxBodyBytes or raise the NATS server's max_payload",
			maxBody, qmax)
	}
	return nil
}

// Handler serves the OpenAI API (/v1/...), /healthz and /readyz.
func (g *Gateway) Handler() http.Handler { return g.api }

// OpsHandler serves /metrics, /healthz and /readyz.
func (g *Gateway) OpsHandler() http.Handler { return g.ops }

// exchange is what the gateway records about one API request.
type exchange struct {
	start      time.Time
	id         string
	endpoint   endpoint
	model      string // metric label: a served model name, or modelUnknown/modelNone
	app        string
	consumer   string
	stream     bool
	lane       string // laneDirect, laneQueue, or laneNone before either
	status     int
	started    bool // response headers were sent
	ttft       time.Duration
	usage      usage
	err        error
	rejectedBy string
}

// usage is the engine's token usage.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func (u usage) total() int {
	if u.TotalTokens > 0 {
		return u.TotalTokens
	}
	return u.PromptTokens + u.CompletionTokens
}

// inference serves one of the inference endpoints.
func (g *Gateway) inference(ep endpoint) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		g.active.Add(1)
		defer g.active.Done()
		x := &exchange{start: time.Now(), id: newRequestID(), endpoint: ep, model: modelNone, lane: laneNone}
		w.Header().Set("X-Request-Id", x.id)
		err := g.serveInference(w, r, x)
		if err != nil {
			g.fail(w, x, err)
		}
		g.record(r, x)
	}
}

func (g *Gateway) serveInference(w http.ResponseWriter, r *http.Request, x *exchange) error {
	p, err := g.authenticate(r)
	if err != nil {
		return err
	}
	x.consumer = p.Name

	body, err := g.readBody(w, r)
	if err != nil {
		return err
	}
	var rc *responsesCall
	var req parsedRequest
	if x.endpoint == endpointResponses {
		rc, req, err = g.prepareResponses(r.Context(), p, x, body)
	} else {
		req, err = parseRequest(x.endpoint, body)
	}
	if err != nil {
		return err
	}
	x.stream = req.Stream
	model, ok := g.models[req.Model]
	if !ok {
		x.model = modelUnknown
		return modelNotFound(req.Model, false)
	}
	x.model, x.app = model.Name, model.App
	if !p.mayUse(req.Model) {
		return modelNotFound(req.Model, true)
	}
	if model.Unavailable != "" {
		return modelUnavailable(req.Model, model.Unavailable)
	}

	maxTokens := req.MaxTokens
	if maxTokens == 0 {
		maxTokens = g.cfg.Limits.AssumedMaxTokens
	}
	if x.endpoint == endpointEmbeddings {
		maxTokens = 0
	}
	adm, err := g.limiter.admit(p, req.Stream, estimateTokens(len(req.Body), maxTokens))
	if err != nil {
		return err
	}
	defer func() { g.limiter.release(adm, p, req.Stream, g.spentTokens(x, adm)) }()

	inFlight := g.metrics.inFlight.WithLabelValues(x.endpoint.label(), strconv.FormatBool(req.Stream))
	inFlight.Inc()
	defer inFlight.Dec()

	timeout := g.cfg.Timeouts.Request.Duration
	if req.Stream {
		timeout = g.cfg.Timeouts.Stream.Duration
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()

	if rc == nil && r.Header.Get(HeaderLane) != laneQueue {
		reply, ask := g.direct(ctx, model, x, req.Body)
		if ask != nil {
			defer ask()
		}
		if reply != nil {
			w.Header().Set(HeaderLane, laneDirect)
			defer func() { _ = reply.Close() }()
			next := func(ctx context.Context, _ http.ResponseWriter, _ *exchange) (queue.Chunk, error) {
				return reply.Next(ctx)
			}
			var err error
			if req.Stream {
				err = g.proxyStream(ctx, w, reply, x, req.IncludeUsage, next)
			} else {
				err = g.proxyUnary(ctx, w, reply, x, next)
			}
			if x.started || !errors.Is(err, queue.ErrRetriedAfterPartial) {
				return err
			}
			// The engine broke off before the client saw anything (a
			// non-streamed answer is read whole first): the queue serves
			// the request instead, as it retries its own attempts.
			_ = reply.Close()
			x.usage = usage{}
			g.logger.Warn("direct lane: the engine broke off before the answer was sent; the request takes the queue", "app", model.App, "err", err)
		}
	}
	x.lane = laneQueue
	w.Header().Set(HeaderLane, laneQueue)
	reply, err := g.queue.Submit(ctx, queue.Job{
		ID:     x.id,
		App:    model.App,
		Path:   x.endpoint.path(),
		Body:   req.Body,
		Stream: req.Stream,
	})
	if err != nil {
		return fmt.Errorf("submitting request: %w", err)
	}
	// Closing an unfinished reply cancels the request down to the engine:
	// this is what happens when the client disconnects or time runs out.
	defer func() { _ = reply.Close() }()

	first := g.waitFirst(model, reply)
	if rc != nil {
		return g.proxyResponses(ctx, w, reply, x, rc, first)
	}
	if req.Stream {
		return g.proxyStream(ctx, w, reply, x, req.IncludeUsage, first)
	}
	return g.proxyUnary(ctx, w, reply, x, first)
}

// spentTokens is what a finished request costs against tokens per minute:
// the engine's usage when it reported one; else the reservation when the
// engine answered (it worked, the cost is unknown); else nothing.
func (g *Gateway) spentTokens(x *exchange, adm admission) int {
	switch {
	case x.usage.total() > 0:
		return x.usage.total()
	case x.started:
		return adm.reserved
	default:
		return 0
	}
}

// authenticate returns the request's principal. In anonymous mode any
// token, or none, is accepted: a known token gets its own principal, any
// other request the shared anonymous one (the official SDKs always send a
// token). A token that may be valid but cannot be checked yet, because the
// token Secrets are still loading, gets errTokensLoading (503), not 401,
// which SDKs treat as final.
func (g *Gateway) authenticate(r *http.Request) (*Principal, error) {
	token, ok := bearerToken(r)
	if ok && g.tokens != nil {
		if p, known := g.tokens.Authenticate(token); known {
			return p, nil
		}
	}
	switch {
	case g.cfg.Auth.Anonymous:
		return g.anon, nil
	case !ok:
		return nil, errMissingToken
	case g.tokens == nil:
		return nil, errInvalidToken
	case !g.tokens.HasSynced():
		return nil, errTokensLoading
	default:
		return nil, errInvalidToken
	}
}

// readBody reads the request body up to the configured limit. Past the
// limit the server closes the connection after answering.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	limit := g.cfg.Limits.MaxBodyBytes
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	var buf []byte
	var err error
	if r.ContentLength > 0 {
		buf = make([]byte, r.ContentLength)
		_, err = io.ReadFull(body, buf)
	} else {
		buf, err = io.ReadAll(body)
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case err == nil:
		return buf, nil
	case errors.As(err, &mbe):
		return nil, err
	case errors.As(err, &ne) && ne.Timeout():
		// The error names the sockets (in a pod, its IP): never echo it.
		return nil, &apiError{status: http.StatusRequestTimeout, err: err, typ: typeInvalidRequest,
			code: "request_timeout", reason: reasonInvalidRequest,
			message: "Timed out reading the request body; send it faster or in a smaller request."}
	default:
		return nil, &apiError{status: http.StatusBadRequest, err: err, typ: typeInvalidRequest,
			reason: reasonInvalidRequest, message: "Could not read the request body."}
	}
}

// fail answers with err: a JSON error before the response started, an SSE
// error event after a stream started.
func (g *Gateway) fail(w http.ResponseWriter, x *exchange, err error) {
	ae := toAPIError(err)
	x.err = err
	x.rejectedBy = ae.reason
	if !x.started {
		x.status = ae.status
		ae.write(w)
		return
	}
	if x.stream && !errors.Is(err, errClientGone) {
		// The status line is gone; tell the client in the stream, and end
		// it without [DONE] so that it cannot pass for a complete answer.
		if _, werr := w.Write(ae.sseEvent()); werr == nil {
			_ = http.NewResponseController(w).Flush()
		}
	}
	// Record the failure, not the 200 already sent, in logs and metrics.
	x.status = ae.status
}

// record writes the access log line and the metrics of one request.
func (g *Gateway) record(r *http.Request, x *exchange) {
	elapsed := time.Since(x.start)
	m := g.metrics
	ep := x.endpoint.label()
	m.requests.WithLabelValues(x.model, ep, strconv.Itoa(x.status), x.lane).Inc()
	m.duration.WithLabelValues(x.model, ep, strconv.FormatBool(x.stream)).Observe(elapsed.Seconds())
	if x.ttft > 0 {
		m.ttft.WithLabelValues(x.model, ep).Observe(x.ttft.Seconds())
	}
	if x.usage.PromptTokens > 0 {
		m.tokens.WithLabelValues(x.model, x.consumer, "prompt").Add(float64(x.usage.PromptTokens))
	}
	if x.usage.CompletionTokens > 0 {
		m.tokens.WithLabelValues(x.model, x.consumer, "completion").Add(float64(x.usage.CompletionTokens))
	}
	if x.rejectedBy != "" {
		m.rejections.WithLabelValues(x.rejectedBy).Inc()
	}
	if !g.cfg.Log.AccessLog {
		return
	}
	level := slog.LevelInfo
	if x.status >= 500 && x.status != statusClientClosed {
		level = slog.LevelWarn
	}
	attrs := []slog.Attr{
		slog.String("request_id", x.id),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", x.status),
		slog.String("model", x.model),
		slog.String("app", x.app),
		slog.String("consumer", x.consumer),
		slog.Bool("stream", x.stream),
		slog.String("lane", x.lane),
		slog.Float64("duration_ms", ms(elapsed)),
		slog.Int("prompt_tokens", x.usage.PromptTokens),
		slog.Int("completion_tokens", x.usage.CompletionTokens),
		slog.String("remote", r.RemoteAddr),
	}
	if x.ttft > 0 {
		attrs = append(attrs, slog.Float64("ttft_ms", ms(x.ttft)))
	}
	if x.rejectedBy != "" {
		attrs = append(attrs, slog.String("rejected", x.rejectedBy))
	}
	if x.err != nil {
		attrs = append(attrs, slog.String("error", x.err.Error()))
	}
	g.logger.LogAttrs(r.Context(), level, "request", attrs...)
}

// ms is a duration in milliseconds, for logs.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// notFound answers paths and methods the gateway does not serve, as OpenAI
// does.
func (g *Gateway) notFound(w http.ResponseWriter, r *http.Request) {
	g.writeSimpleError(w, &apiError{
		status:  http.StatusNotFound,
		message: fmt.Sprintf("Invalid URL (%s %s)", r.Method, cmp.Or(r.URL.Path, r.RequestURI)),
		typ:     typeInvalidRequest,
		reason:  reasonNotFound,
	})
}

// writeSimpleError answers a non-inference request with an error.
func (g *Gateway) writeSimpleError(w http.ResponseWriter, err error) {
	ae := toAPIError(err)
	if ae.reason != "" {
		g.metrics.rejections.WithLabelValues(ae.reason).Inc()
	}
	ae.write(w)
}

func (g *Gateway) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "ok\n")
}

// readyz reports ready when the gateway is not draining, its tokens are
// loaded and its queue (when it can tell) is reachable.
func (g *Gateway) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	var problem string
	switch {
	case g.draining.Load():
		problem = "draining"
	case g.tokens != nil && !g.tokens.HasSynced():
		problem = "api tokens not loaded yet"
	default:
		if p, ok := g.queue.(Pinger); ok {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			err := p.Ping(ctx)
			cancel()
			if err != nil {
				problem = "queue unreachable: " + err.Error()
			}
		}
	}
	if problem != "" {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, problem+"\n")
		return
	}
	_, _ = io.WriteString(w, "ok\n")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		toAPIError(err).write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// newRequestID returns a random 128-bit id, used as the job id (which the
// queue de-duplicates on) and returned as X-Request-Id.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
