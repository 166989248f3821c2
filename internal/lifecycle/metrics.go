package lifecycle

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Wake stages, the values of the stage label of wake_seconds: decision
// (first request seen -> replicas written), scheduled (-> the root pod is
// bound to a node), started (-> its engine container runs), ready (-> it
// passes its readiness probe) and dispatch (the leader's cache shows the
// root serving -> the queue reopened), observed by the leader; and
// first_token, observed by
// the dispatcher that answers: from the root reaching its pool (the
// EndpointSlice) to the first data of the answer to a request that waited
// for the wake, once per wake and dispatcher.
const (
	stageDecision   = "decision"
	stageScheduled  = "scheduled"
	stageStarted    = "started"
	stageReady      = "ready"
	stageDispatch   = "dispatch"
	stageFirstToken = "first_token"
)

// Wake triggers, the values of the trigger label of wakes_total.
const (
	triggerRequest = "request"
	triggerBacklog = "backlog"
)

var allStates = []v1alpha1.LifecycleState{v1alpha1.LifecycleAwake, v1alpha1.LifecycleWaking, v1alpha1.LifecycleDraining, v1alpha1.LifecycleZero, v1alpha1.LifecycleAsleep}

type metrics struct {
	state       *prometheus.GaugeVec
	replicas    *prometheus.GaugeVec
	wakes       *prometheus.CounterVec
	wakeSeconds *prometheus.HistogramVec
	waiting     *prometheus.GaugeVec
	scalings    *prometheus.CounterVec
	drains      *prometheus.CounterVec
	leader      prometheus.Gauge
	queueWait   *prometheus.HistogramVec
	// leases and leaseReports: the gateways' direct lanes (leaseuse.go).
	leases       *prometheus.GaugeVec
	leaseReports *prometheus.CounterVec
}

// metricsNamespace prefixes every metric of the leader's lifecycle.
const metricsNamespace = "orchestra_lifecycle"

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = metricsNamespace
	m := &metrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "state",
			Help: "1 for the lifecycle state each application is in (Awake, Waking, Draining, Zero, Asleep), as seen by the leader."}, []string{"app", "state"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "replicas",
			Help: "Replica count the leader last wrote for the application's root StatefulSet."}, []string{"app"}),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "wakes_total",
			Help: "Wakes from zero, by what started them (request: a request arrived; backlog: requests were queued when the leader took over)."}, []string{"app", "trigger"}),
		wakeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "wake_seconds",
			Help:    "Duration of each stage of a wake from zero: decision, scheduled, started, ready, dispatch (the leader's cache shows the root serving -> queue reopened), first_token (dispatcher).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}}, []string{"app", "stage"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "requests_waiting",
			Help: "Requests queued for an application that is not awake (waiting on a wake)."}, []string{"app"}),
		scalings: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scale_total",
			Help: "Replica count changes written by the leader, by direction (up, down, zero, wake)."}, []string{"app", "direction"}),
		drains: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "drains_total",
			Help: "Attempts to go to zero, by outcome (zero; cancelled: a request arrived or work was in flight)."}, []string{"app", "outcome"}),
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "leader",
			Help: "1 while this dispatcher holds the lifecycle Lease and decides replica counts."}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "queue_wait_seconds",
			Help:    "Time from a request being stored to its first delivery by this dispatcher; cold: it was stored while its application was not awake.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}}, []string{"app", "cold"}),
		leases: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "direct_leases",
			Help: "Engine slots lent to gateways' direct lanes at the last reading, by use (busy: a request runs on it, or the leader cannot tell yet; idle: held for the next request, holding off no sleep or scale to zero)."}, []string{"app", "use"}),
		leaseReports: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "direct_lease_reports_total",
			Help: "Gateways' reports of their leases' use received by the leader (a request starts or ends on a lease, and a heartbeat every second while one runs)."}, []string{"app"}),
	}
	reg.MustRegister(m.state, m.replicas, m.wakes, m.wakeSeconds, m.waiting, m.scalings, m.drains, m.leader, m.queueWait, m.leases, m.leaseReports)
	return m
}

func (m *metrics) setState(app string, s v1alpha1.LifecycleState) {
	for _, st := range allStates {
		v := 0.0
		if st == s {
			v = 1
		}
		m.state.WithLabelValues(app, string(st)).Set(v)
	}
}
