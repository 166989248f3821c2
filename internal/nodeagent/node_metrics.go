package nodeagent

import "github.com/prometheus/client_golang/prometheus"

// nodeMetrics are the node agent's metrics (GET /metrics).
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
