package checkpoint

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/model-orchestra/operator/internal/sidecarapi"
)

type seatMetrics struct {
	state       *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	seconds     *prometheus.HistogramVec
}

func newSeatMetrics(reg prometheus.Registerer) *seatMetrics {
	m := &seatMetrics{
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "orchestra_agent_seat_state", Help: "1 for the seat's current state, 0 for the others.",
		}, []string{"state"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_seat_transitions_total", Help: "Sleeps, wakes and engine restarts (op) by result (ok, failed, abandoned: a wake overtook the drain).",
		}, []string{"op", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "orchestra_agent_seat_transition_seconds", Help: "Duration of successful sleeps (drain included), wakes and engine restarts.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		}, []string{"op"}),
	}
	reg.MustRegister(m.state, m.transitions, m.seconds)
	return m
}

func (m *seatMetrics) setState(st sidecarapi.State) {
	for _, s := range sidecarapi.States {
		v := 0.0
		if s == st {
			v = 1
		}
		m.state.WithLabelValues(string(s)).Set(v)
	}
}

type nodeMetrics struct {
	tierBytes  *prometheus.GaugeVec
	budget     *prometheus.GaugeVec
	evictions  *prometheus.CounterVec
	bandwidth  *prometheus.GaugeVec
	promotions *prometheus.CounterVec
	demotions  *prometheus.CounterVec
	verified   *prometheus.CounterVec
	// aheadPromotions counts promotions ahead of predicted wakes.
	aheadPromotions *prometheus.CounterVec
}

func newNodeMetrics(reg prometheus.Registerer) *nodeMetrics {
	m := &nodeMetrics{
		tierBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "orchestra_agent_tier_bytes", Help: "Bytes held in each of the agent's tiers.",
		}, []string{"tier"}),
		budget: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "orchestra_agent_tier_budget_bytes", Help: "Byte budget of each tier.",
		}, []string{"tier"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_evictions_total", Help: "Copies evicted from a tier, by action (demote to warm, drop).",
		}, []string{"tier", "action"}),
		bandwidth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "orchestra_agent_read_bytes_per_second", Help: "Read bandwidth measured at start, per tier (and memcpy); cold/<source>: the last copy from a cold source (modelCache, or an S3 source by its name).",
		}, []string{"tier"}),
		promotions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_promotions_total", Help: "Promotions into a tier by result (ok, failed, mismatch).",
		}, []string{"tier", "result"}),
		demotions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_demotions_total", Help: "Requested demotions from the hot to the warm tier (POST /demote) by result (ok; mismatch: the hot bytes did not hash to the recorded digest, nothing placed; failed).",
		}, []string{"result"}),
		verified: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_verifications_total", Help: "Periodic re-hashes of the kept copies (--verify-interval) by tier and result (ok; dropped: the copy no longer matched its digest or could not be read, and was removed).",
		}, []string{"tier", "result"}),
		aheadPromotions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_agent_ahead_promotions_total", Help: "Promotions ahead of a predicted wake (--promote-interval), by source and target tier and result (ok; mismatch: the copy did not hash to the digest, nothing placed; failed; deferred: due but refused by the budgets or without a source, source empty).",
		}, []string{"from", "to", "result"}),
	}
	reg.MustRegister(m.tierBytes, m.budget, m.evictions, m.bandwidth, m.promotions, m.demotions, m.verified, m.aheadPromotions)
	return m
}

func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

func metricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer","code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	var e apiError
	e.Error.Message, e.Error.Code = msg, status
	writeJSON(w, status, e)
}

// readBody decodes a request's JSON body (at most 1 MiB) into v, answering
// 400 when it cannot.
func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return false
	}
	return true
}
