package sidecar

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// sidecarMetrics are the sidecar's metrics (GET /metrics).
type sidecarMetrics struct {
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
}

func newSidecarMetrics(reg prometheus.Registerer) *sidecarMetrics {
	m := &sidecarMetrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "orchestra_agent_sidecar_state", Help: "1 for the sidecar's current state, 0 for the others.",
		}, []string{"state"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_sidecar_transitions_total", Help: "Sleeps, wakes and engine restarts (op) by result (ok, failed, abandoned: a wake overtook the drain).",
		}, []string{"op", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "orchestra_agent_sidecar_transition_seconds", Help: "Duration of successful sleeps (drain included), wakes and engine restarts.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"op"}),
	}
	reg.MustRegister(m.state, m.transitions, m.seconds)
	return m
}

func (m *sidecarMetrics) setState(st sidecarapi.State) {
	for _, s := range sidecarapi.States {
		v := 0.0
		if s == st {
			v = 1
		}
		m.state.WithLabelValues(string(s)).Set(v)
	}
}
