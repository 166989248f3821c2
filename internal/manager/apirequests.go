package manager

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// apiRequests counts the operator's requests to the API server by verb and
// resource, when Config.CountAPIRequests is set; it is how the requests an
// install costs are counted (make bench-reconcile).
var apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "orchestra_api_requests_total",
	Help: "Requests to the Kubernetes API server, by verb (get, list, watch, create, update, patch, delete, apply) and resource[/subresource]. Counted only with --count-api-requests.",
}, []string{"verb", "resource"})

func init() { ctrlmetrics.Registry.MustRegister(apiRequests) }

// countingTransport counts each request before passing it on.
type countingTransport struct{ next http.RoundTripper }

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	verb, resource := classify(req)
	apiRequests.WithLabelValues(verb, resource).Inc()
	return t.next.RoundTrip(req)
}

// classify names a request's verb and resource from its method and path
// (/api/v1/namespaces/ns/secrets/name, /apis/g/v/resource, ...).
func classify(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return strings.ToLower(req.Method), "/" + strings.Join(parts, "/") // discovery, /version, ...
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) != 2 {
		parts = parts[2:] // namespaced; "namespaces/<name>" alone is the namespace itself
	}
	named := len(parts) >= 2
	switch len(parts) {
	case 0:
		return strings.ToLower(req.Method), "(discovery)"
	case 1, 2:
		resource = parts[0]
	default:
		resource = parts[0] + "/" + parts[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named:
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
		if req.Header.Get("Content-Type") == "application/apply-patch+yaml" {
			verb = "apply"
		}
	case http.MethodDelete:
		verb = "delete"
		if !named {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}
