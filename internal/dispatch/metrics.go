package dispatch

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	backlog      *prometheus.GaugeVec
	ackPending   *prometheus.GaugeVec
	inflight     *prometheus.GaugeVec
	queueWait    *prometheus.HistogramVec
	engineTime   *prometheus.HistogramVec
	rootHealthy  *prometheus.GaugeVec
	dispatched   *prometheus.CounterVec
	completed    *prometheus.CounterVec
	failed       *prometheus.CounterVec
	redelivered  *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	cancelled    *prometheus.CounterVec
	leases       *prometheus.GaugeVec
	leaseGrants  *prometheus.CounterVec
	// leaseBusyTakebacks counts leases taken back while a request ran on
	// them (their slot kept until it ended).
	leaseBusyTakebacks *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = "orchestra_dispatcher"
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m := &metrics{
		backlog: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "backlog",
			Help: "Requests queued and not yet delivered, per application (consumer NumPending)."}, []string{"app"}),
		ackPending: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "ack_pending",
			Help: "Requests delivered to dispatchers and not yet acknowledged, per application."}, []string{"app"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "inflight",
			Help: "Requests this dispatcher is running on engines."}, []string{"app"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "queue_wait_seconds",
			Help: "Time from a request being stored to its first delivery.", Buckets: buckets}, []string{"app"}),
		engineTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "engine_request_seconds",
			Help: "Duration of engine requests, including streaming the answer.", Buckets: buckets}, []string{"app"}),
		rootHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "root_healthy",
			Help: "1 when an engine root receives traffic, 0 while ejected or gone."}, []string{"app", "root"}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dispatched_total",
			Help: "Deliveries sent to an engine."}, []string{"app"}),
		completed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "completed_total",
			Help: "Requests answered and acknowledged, by engine status code."}, []string{"app", "code"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "failed_total",
			Help: "Failed attempts, by reason; they are retried until maxDeliver."}, []string{"app", "reason"}),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "redelivered_total",
			Help: "Deliveries that were not the first attempt."}, []string{"app"}),
		deadLettered: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "dead_lettered_total",
			Help: "Requests moved to the dead-letter stream."}, []string{"app"}),
		cancelled: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "cancelled_total",
			Help: "Requests cancelled by their client."}, []string{"app"}),
		leases: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "leases",
			Help: "Engine slots this dispatcher lends to gateways' direct lanes, per application."}, []string{"app"}),
		leaseGrants: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lease_requests_total",
			Help: "Lease requests by outcome: granted, busy (no free slot: only spare capacity is lent), refused (routing must choose the root), expired (past the gateway's deadline) or unwanted (the gateway no longer waited)."}, []string{"app", "outcome"}),
		leaseBusyTakebacks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "lease_busy_takebacks_total",
			Help: "Leases taken back while the gateway reported a request running on them, by cause: max_age (leaseMaxAge) or queued (queued requests waited for a slot); their slot stayed lent until the request ended."}, []string{"app", "cause"}),
	}
	reg.MustRegister(m.leases, m.leaseGrants, m.leaseBusyTakebacks, m.backlog, m.ackPending, m.inflight, m.queueWait, m.engineTime, m.rootHealthy,
		m.dispatched, m.completed, m.failed, m.redelivered, m.deadLettered, m.cancelled)
	return m
}

// appMetrics are one application's per-request series, looked up once
// rather than by label on every request.
type appMetrics struct {
	inflight              prometheus.Gauge
	dispatched            prometheus.Counter
	queueWait, engineTime prometheus.Observer
	completedOK           prometheus.Counter
	completedBy           *prometheus.CounterVec
	name                  string
}

func (m *metrics) forApp(name string) appMetrics {
	return appMetrics{
		inflight:    m.inflight.WithLabelValues(name),
		dispatched:  m.dispatched.WithLabelValues(name),
		queueWait:   m.queueWait.WithLabelValues(name),
		engineTime:  m.engineTime.WithLabelValues(name),
		completedOK: m.completed.WithLabelValues(name, "200"),
		completedBy: m.completed,
		name:        name,
	}
}

// completed is the completed_total series of an engine status.
func (a *app) completed(status int) prometheus.Counter {
	if status == http.StatusOK {
		return a.m.completedOK
	}
	return a.m.completedBy.WithLabelValues(a.m.name, strconv.Itoa(status))
}
