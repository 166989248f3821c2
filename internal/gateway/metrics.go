package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are the gateway's Prometheus metrics, on a registry of its own
// (served by OpsHandler), so that several gateways can live in one process.
type metrics struct {
	registry   *prometheus.Registry
	requests   *prometheus.CounterVec   // model, endpoint, code, lane
	duration   *prometheus.HistogramVec // model, endpoint, stream
	ttft       *prometheus.HistogramVec // model, endpoint
	tokens     *prometheus.CounterVec   // model, consumer, kind
	rejections *prometheus.CounterVec   // reason
	inFlight   *prometheus.GaugeVec     // endpoint, stream
	apiTokens  prometheus.Gauge
	// wakeWaiting and wakeWait: requests waiting for their model to wake,
	// and how long they waited (model).
	wakeWaiting *prometheus.GaugeVec
	wakeWait    *prometheus.HistogramVec
}

// Values of the model label for requests that name no served model, so
// that clients cannot grow the label set.
const (
	modelUnknown = "_unknown"
	modelNone    = "_none"
)

func newMetrics() *metrics {
	const ns = "orchestra_gateway"
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "requests_total",
			Help: "API requests by served model, endpoint, HTTP status code and lane (direct: straight to an engine on a lent slot; queue: through the queue).",
		}, []string{"model", "endpoint", "code", "lane"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "request_duration_seconds",
			Help:    "Time from receiving an API request to sending the last byte of its answer.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"model", "endpoint", "stream"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "time_to_first_token_seconds",
			Help:    "Time from receiving a streaming request to sending its first non-empty text (a chat delta's content, a completion's text).",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"model", "endpoint"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "tokens_total",
			Help: "Tokens reported by the engine's usage, by served model, consumer (token name) and kind (prompt or completion).",
		}, []string{"model", "consumer", "kind"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "rejections_total",
			Help: "Requests refused by the gateway itself, by reason.",
		}, []string{"reason"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "in_flight_requests",
			Help: "API requests being served, by endpoint and whether they stream.",
		}, []string{"endpoint", "stream"}),
		apiTokens: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "api_tokens",
			Help: "Usable API tokens loaded from Secrets.",
		}),
		wakeWaiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "wake_waiting_requests",
			Help: "Requests waiting for their model's application to wake, by served model.",
		}, []string{"model"}),
		wakeWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "wake_wait_seconds",
			Help:    "Time requests waited for their model's application to wake, by served model.",
			Buckets: []float64{.25, .5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600},
		}, []string{"model"}),
	}
	m.registry.MustRegister(m.requests, m.wakeWaiting, m.wakeWait, m.duration, m.ttft, m.tokens, m.rejections, m.inFlight, m.apiTokens,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, r := range []string{
		reasonUnauthenticated, reasonModelNotFound, reasonModelForbidden, reasonInvalidRequest,
		reasonBodyTooLarge, reasonRequestRate, reasonTokenRate, reasonConcurrency, reasonNotFound, reasonModelNotServed,
	} {
		m.rejections.WithLabelValues(r)
	}
	return m
}
