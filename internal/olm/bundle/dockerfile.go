package bundle

import (
	"strings"

	"github.com/model-orchestra/operator/internal/olm/check"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// ValidateDockerfile checks a bundle image Dockerfile against the bundle's
// annotations: OLM reads the image labels, opm and operator-sdk the
// annotations file, so every annotation must be a LABEL with the same value,
// and the image must hold /manifests/ and /metadata/.
func ValidateDockerfile(data []byte, a manifest.BundleAnnotations) check.Report {
	var r check.Report
	const obj = "bundle.Dockerfile"
	labels := map[string]string{}
	var copies []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "LABEL":
			for _, kv := range fields[1:] {
				k, v, ok := strings.Cut(kv, "=")
				if ok {
					labels[k] = strings.Trim(v, `"`)
				}
			}
		case "COPY", "ADD":
			if len(fields) >= 3 {
				copies = append(copies, fields[len(fields)-1])
			}
		}
	}
	for _, k := range a.SortedKeys() {
		v, ok := labels[k]
		switch {
		case !ok:
			r.Errorf("dockerfile-labels", obj, "LABEL %s is missing", k)
		case v != a.Annotations[k]:
			r.Errorf("dockerfile-labels", obj, "LABEL %s=%s differs from annotations.yaml (%s)", k, v, a.Annotations[k])
		}
	}
	for _, want := range []string{"/manifests/", "/metadata/"} {
		found := false
		for _, c := range copies {
			if strings.TrimSuffix(c, "/")+"/" == want {
				found = true
			}
		}
		if !found {
			r.Errorf("dockerfile-layout", obj, "nothing is copied to %s", want)
		}
	}
	return r
}
