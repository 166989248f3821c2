package validation

import (
	"fmt"
	"net/url"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// MinNATSStorage is the smallest in-cluster NATS volume. The chart gives
// JetStream the whole volume (max_file_store), and JetStream refuses a file
// stream whose reservation does not fit beside the others: the dispatcher's
// request stream reserves its MaxBytes, 1 GiB, and the dead-letter stream
// (no MaxBytes, so it reserves nothing but needs room to grow) is then
// refused with "insufficient storage resources available" when nothing is
// left. 2 GiB leaves the dead-letter stream, consumer state and the file
// store's own overhead 1 GiB beside the request stream.
var MinNATSStorage = resource.MustParse("2Gi")

// Spec checks the rules of a defaulted ModelOrchestra spec that the CRD
// does not express. They are not CEL rules on purpose: a new CEL rule that
// is not a transition rule would be checked against objects stored by an
// earlier version (internal/olm/crdcompat refuses it), whereas the operator
// and `orchestra template` check these when they render, naming the field.
func Spec(spec *v1alpha1.ModelOrchestraSpec) field.ErrorList {
	var errs field.ErrorList
	root := field.NewPath("spec")

	if spec.NATS.URL == "" && spec.NATS.Storage != nil {
		size := spec.NATS.Storage.Size
		if size.Cmp(MinNATSStorage) < 0 {
			errs = append(errs, field.Invalid(root.Child("nats", "storage", "size"), size.String(),
				fmt.Sprintf("must be at least %s: JetStream may use the whole volume, the request stream reserves 1Gi of it and the dead-letter stream needs room beside it", MinNATSStorage.String())))
		}
	}

	names := make([]string, 0, len(spec.Applications))
	for name := range spec.Applications {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		m := spec.Applications[name].Model
		p := root.Child("applications").Key(name).Child("model", "hubEndpoint")
		if m.HubEndpoint == "" {
			continue
		}
		if !strings.HasPrefix(m.Source, "hf://") {
			errs = append(errs, field.Invalid(p, m.HubEndpoint, "hubEndpoint is only used with hf:// sources; remove it or use an hf:// source"))
			continue
		}
		if msg := hubEndpointProblem(m.HubEndpoint); msg != "" {
			errs = append(errs, field.Invalid(p, m.HubEndpoint, msg))
		}
	}
	return append(errs, seatNodeSelectors(spec, names)...)
}

// seatNodeSelectors refuses applications of one seat group whose node
// selectors conflict: they run in one pod, which no node could satisfy. It
// is not a CEL rule because runtime.nodeSelector is an unbounded map, over
// which a pairwise rule exceeds the API server's cost budget. names are
// the sorted application names.
func seatNodeSelectors(spec *v1alpha1.ModelOrchestraSpec, names []string) field.ErrorList {
	var errs field.ErrorList
	first := map[string]string{} // seat group -> first application (in name order) with a node selector
	for _, name := range names {
		app := spec.Applications[name]
		if app.Lifecycle == nil || app.Lifecycle.Seat == nil || len(app.Runtime.NodeSelector) == 0 {
			continue
		}
		group := app.Lifecycle.Seat.Group
		other, ok := first[group]
		if !ok {
			first[group] = name
			continue
		}
		theirs := spec.Applications[other].Runtime.NodeSelector
		keys := make([]string, 0, len(app.Runtime.NodeSelector))
		for k := range app.Runtime.NodeSelector {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if v, set := theirs[k]; set && v != app.Runtime.NodeSelector[k] {
				errs = append(errs, field.Invalid(field.NewPath("spec", "applications").Key(name).Child("runtime", "nodeSelector").Key(k), app.Runtime.NodeSelector[k],
					fmt.Sprintf("seat group %q runs its applications in one pod, but application %q selects %s=%s: use the same value, or another seat group", group, other, k, v)))
			}
		}
	}
	return errs
}

// hubEndpointProblem says what is wrong with a hub endpoint URL, or "".
func hubEndpointProblem(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return "must be an absolute http:// or https:// URL: " + err.Error()
	case u.Scheme != "http" && u.Scheme != "https":
		return "must be an absolute http:// or https:// URL"
	case u.Host == "" || u.Hostname() == "":
		return "must name a host, for example http://hf-mirror.models.svc:8080"
	case u.User != nil:
		return "must not hold credentials (they would be visible in the fetch Job); use tokenSecretRef"
	case u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "?") || strings.HasSuffix(s, "#"):
		return "must not have a query or fragment: the fetcher appends the hub's API paths to it"
	}
	return ""
}
