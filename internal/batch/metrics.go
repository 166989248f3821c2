package batch

import (
	"encoding/json"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	files     *prometheus.CounterVec // purpose
	fileBytes *prometheus.CounterVec // purpose
	batches   *prometheus.CounterVec // status
	lines     prometheus.Counter
	results   *prometheus.CounterVec // result
}

func newMetrics(reg prometheus.Registerer) *metrics {
	const ns = "orchestra_gateway"
	m := &metrics{
		files: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "files_created_total",
			Help: "Files stored (uploads, and batch output and error files), by purpose."}, []string{"purpose"}),
		fileBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "file_bytes_total",
			Help: "Bytes of uploaded files, by purpose."}, []string{"purpose"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batch_transitions_total",
			Help: "Batches entering each status."}, []string{"status"}),
		lines: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "batch_lines_queued_total",
			Help: "Batch lines put on the batch stream."}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "batch_lines_finished_total",
			Help: "Lines of finished batches, by result (completed or failed, expired and cancelled included)."}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.collectors()...)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.files, m.fileBytes, m.batches, m.lines, m.results}
}

// Collectors returns the service's metrics, for a registry that did not
// get them through Config.Registry.
func (s *Service) Collectors() []prometheus.Collector { return s.m.collectors() }

func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}
