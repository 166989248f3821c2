package agenthttp

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/nodeapi"
)

// Finish ends the API of either role the same way: it adds
//
//	GET /healthz   200 while the agent runs
//	GET /metrics   reg's metrics
//
// to mux and, with a caller token file, requires the release's caller
// token of every mutating request (nodeapi.RequireCaller; refusals are
// WriteError bodies). Without one it logs that whose mutating endpoints
// (e.g. "the sidecar's") accept any caller, and serves mux as it is.
func Finish(mux *http.ServeMux, reg *prometheus.Registry, callerTokenFile string, log *slog.Logger, whose string) http.Handler {
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("GET /metrics", MetricsHandler(reg))
	if callerTokenFile == "" {
		log.Warn("no --caller-token-file: " + whose + " mutating endpoints accept any caller the network lets through")
		return mux
	}
	return nodeapi.RequireCaller(nodeapi.TokenFile(callerTokenFile), mux, WriteError)
}
