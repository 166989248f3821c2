// Package agenthttp holds what both roles of orchestra-agent answer HTTP
// with: JSON answers, the error body the clients of internal/nodeapi and
// internal/sidecarapi read ({"error":{"message","code"}}), request body
// decoding, the metrics registry and its handler, and the common end of
// both roles' APIs (/healthz, /metrics, the caller-token check).
//
// Files:
//   - httpjson.go: WriteJSON, WriteError, ReadBody, NewRegistry,
//     MetricsHandler.
//   - finish.go: Finish.
package agenthttp

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry is a role's metrics registry, with the Go runtime's and the
// process's collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// MetricsHandler serves reg (GET /metrics).
func MetricsHandler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

// apiError is the body of every refusal of both roles: the shape the
// clients of internal/nodeapi and internal/sidecarapi read.
type apiError struct {
	Error struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// WriteJSON answers status with v as JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer","code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// WriteError answers status with msg in an apiError.
func WriteError(w http.ResponseWriter, status int, msg string) {
	var e apiError
	e.Error.Message, e.Error.Code = msg, status
	WriteJSON(w, status, e)
}

// ReadBody decodes a request's JSON body (at most 1 MiB) into v, answering
// 400 when it cannot.
func ReadBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(body, v)
	}
	if err != nil {
		WriteError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return false
	}
	return true
}
