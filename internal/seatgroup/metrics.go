package seatgroup

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of an action, the values of the result label of actions_total.
const (
	resultOK = "ok"
	// resultFailed: the seat, the engine or the memory reading failed.
	resultFailed = "failed"
	// resultRetry: the premise changed (a request slipped in before the
	// gate closed, the memory was not freed); the next decision redoes it.
	resultRetry = "retry"
)

// Restart reasons, the values of the reason label of restarts_total.
const (
	reasonMemoryNotFreed = "memory_not_freed"
	reasonFailed         = "failed"
)

type metrics struct {
	holder      *prometheus.GaugeVec
	swaps       *prometheus.CounterVec
	swapSeconds *prometheus.HistogramVec
	seatWait    *prometheus.HistogramVec
	drain       *prometheus.HistogramVec
	actions     *prometheus.CounterVec
	restarts    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = "orchestra_seatgroup"
	secs := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
	m := &metrics{
		holder: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "seat_holder",
			Help: "1 for each application that holds a seat of its group (awake or draining), else 0."}, []string{"group", "app"}),
		swaps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "swaps_total",
			Help: "Swaps: an application woken into a seat another one gave up in the same decision, by the application woken."}, []string{"group", "app"}),
		swapSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "swap_seconds",
			Help:    "Seconds from the start of the sleep (or restart) that gave up a seat to the end of the wake into it: the time the seat served nobody. Draining is not included.",
			Buckets: secs}, []string{"group"}),
		seatWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "seat_wait_seconds",
			Help:    "Seconds the oldest queued request of an application had waited when the application got a seat (its wake ended).",
			Buckets: secs}, []string{"group", "app"}),
		drain: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "drain_seconds",
			Help:    "Seconds a holder drained (dispatching stopped, requests in flight finishing) before it was put to sleep.",
			Buckets: secs}, []string{"group"}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "actions_total",
			Help: "Actions applied, by kind (Wake, Drain, Resume, Sleep, CheckMemory, Restart) and result (ok, failed, retry)."}, []string{"group", "action", "result"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "restarts_total",
			Help: "Engines restarted, by reason (memory_not_freed: asleep but still holding its memory; failed: its sidecar reported Failed)."}, []string{"group", "app", "reason"}),
	}
	// Several groups, and the executors of successive leaderships in one
	// process, share a registry: they share its collectors too.
	register(reg, &m.holder)
	register(reg, &m.swaps)
	register(reg, &m.swapSeconds)
	register(reg, &m.seatWait)
	register(reg, &m.drain)
	register(reg, &m.actions)
	register(reg, &m.restarts)
	return m
}

// register registers *c with reg, or points *c at the collector reg
// already holds under the same description.
func register[C prometheus.Collector](reg prometheus.Registerer, c *C) {
	if err := reg.Register(*c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				*c = existing
				return
			}
		}
		panic(err)
	}
}
