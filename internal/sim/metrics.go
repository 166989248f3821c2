package sim

import "github.com/prometheus/client_golang/prometheus"

// metrics are named like vLLM's so dashboards and autoscalers built for vLLM
// work against the simulator unchanged.
type metrics struct {
	running         prometheus.Gauge
	waiting         prometheus.Gauge
	kvCacheUsage    prometheus.Gauge
	promptTokens    prometheus.Counter
	generatedTokens prometheus.Counter
	success         *prometheus.CounterVec
	ttft            prometheus.Histogram
	itl             prometheus.Histogram
	e2e             prometheus.Histogram
	queueTime       prometheus.Histogram
	faults          *prometheus.CounterVec

	// Prefix cache.
	prefixQueries prometheus.Counter
	prefixHits    prometheus.Counter
	prefixCached  prometheus.Gauge

	// Sleep mode.
	weightsBytes  prometheus.Gauge
	residentBytes prometheus.Gauge
	level         prometheus.Gauge
	refusedAsleep prometheus.Counter
	sleeps        *prometheus.CounterVec
	wakes         *prometheus.CounterVec
	stageSeconds  *prometheus.HistogramVec
	movedBytes    *prometheus.CounterVec
}

// Operations whose stages are timed.
const (
	opLoad  = "load"
	opSleep = "sleep"
	opWake  = "wake"
)

// stage records the stages of one load, sleep or wake.
func (m *metrics) stage(op string, r *StageReport) {
	tier := tierLabel(r.Tier)
	for stage, sec := range map[string]float64{"alloc": r.AllocSeconds, "copy": r.CopySeconds, "verify": r.VerifySeconds, "free": r.FreeSeconds, "total": r.TotalSeconds} {
		m.stageSeconds.WithLabelValues(op, tier, stage).Observe(sec)
	}
	m.movedBytes.WithLabelValues(op, tier).Add(float64(r.Bytes))
}

func newMetrics(reg prometheus.Registerer, model string) *metrics {
	labels := prometheus.Labels{"model_name": model}
	latency := []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	m := &metrics{
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vllm:num_requests_running", Help: "Number of requests in model execution batches.", ConstLabels: labels,
		}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vllm:num_requests_waiting", Help: "Number of requests waiting to be processed.", ConstLabels: labels,
		}),
		kvCacheUsage: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "vllm:kv_cache_usage_perc", Help: "KV-cache usage. 1 means 100 percent usage.", ConstLabels: labels,
		}),
		promptTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:prompt_tokens_total", Help: "Number of prefill tokens processed.", ConstLabels: labels,
		}),
		generatedTokens: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vllm:generation_tokens_total", Help: "Number of generation tokens processed.", ConstLabels: labels,
		}),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{"finished_reason"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:time_to_first_token_seconds", Help: "Histogram of time to first token in seconds.", ConstLabels: labels, Buckets: latency,
		}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:inter_token_latency_seconds", Help: "Histogram of inter-token latency in seconds.", ConstLabels: labels, Buckets: latency,
		}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:e2e_request_latency_seconds", Help: "Histogram of end to end request latency in seconds.", ConstLabels: labels, Buckets: latency,
		}),
		queueTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "vllm:request_queue_time_seconds", Help: "Histogram of time spent in WAITING phase for request.", ConstLabels: labels, Buckets: latency,
		}),
		faults: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "orchestra_sim_faults_injected_total", Help: "Faults injected by the simulator, by kind (error, hang, crash).",
		}, []string{"kind"}),
	}
	m.prefixQueries = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vllm:prefix_cache_queries_total", Help: "Prefix cache queries, in terms of number of queried tokens.", ConstLabels: labels,
	})
	m.prefixHits = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "vllm:prefix_cache_hits_total", Help: "Prefix cache hits, in terms of number of cached tokens.", ConstLabels: labels,
	})
	m.prefixCached = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "orchestra_sim_prefix_cache_tokens", Help: "Tokens held in the prefix cache (whole blocks).", ConstLabels: labels,
	})
	m.weightsBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "orchestra_sim_weights_bytes", Help: "Size of the simulated model weights.",
	})
	m.residentBytes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "orchestra_sim_weights_resident_bytes", Help: "Device memory the engine holds for its weights, as nvidia-smi shows per process (0 while asleep, unless the memory was not freed on sleep).",
	})
	m.level = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "orchestra_sim_sleep_level", Help: "0 when awake, else the sleep level (1 or 2).",
	})
	m.refusedAsleep = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "orchestra_sim_requests_refused_asleep_total", Help: "Inference requests refused with 503 because the engine was not awake.",
	})
	m.sleeps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_sim_sleeps_total", Help: "Sleep requests by level and result (ok, refused: requests in flight, failed).",
	}, []string{"level", "result"})
	m.wakes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_sim_wakes_total", Help: "Weight restores by source tier and result (ok, failed, mismatch: hash verification failed).",
	}, []string{"tier", "result"})
	m.stageSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "orchestra_sim_weights_stage_seconds", Help: "Seconds per stage (alloc, copy, verify, free, total) of loading, sleeping and waking, by tier.",
		Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"op", "tier", "stage"})
	m.movedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "orchestra_sim_weights_moved_bytes_total", Help: "Weight bytes moved by loads, sleeps and wakes, by tier.",
	}, []string{"op", "tier"})
	reg.MustRegister(m.running, m.waiting, m.kvCacheUsage, m.promptTokens, m.generatedTokens, m.success,
		m.ttft, m.itl, m.e2e, m.queueTime, m.faults, m.prefixQueries, m.prefixHits, m.prefixCached,
		m.weightsBytes, m.residentBytes, m.level, m.refusedAsleep, m.sleeps, m.wakes, m.stageSeconds, m.movedBytes)
	return m
}
