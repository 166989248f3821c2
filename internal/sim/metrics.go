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
	reg.MustRegister(m.running, m.waiting, m.kvCacheUsage, m.promptTokens, m.generatedTokens, m.success,
		m.ttft, m.itl, m.e2e, m.queueTime, m.faults)
	return m
}
