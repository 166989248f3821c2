package preview

import (
	"os"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"
)

const chartDir = "../../../charts/modelorchestra"

// TestChartLint is `helm lint --strict` on the chart, with its default
// values and with the CI values that enable every engine and option.
func TestChartLint(t *testing.T) {
	ci, err := os.ReadFile(chartDir + "/ci/all-engines-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var ciValues map[string]any
	if err := yaml.Unmarshal(ci, &ciValues); err != nil {
		t.Fatal(err)
	}
	for name, vals := range map[string]map[string]any{"defaults": {}, "all engines": ciValues} {
		t.Run(name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			res := lint.Run([]string{chartDir}, vals)
			for _, err := range res.Errors {
				t.Errorf("lint error: %v", err)
			}
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("lint: %s", m)
				}
			}
		})
	}
}

// TestChartSchemaRefusesBadValues: values.schema.json catches values the
// translator would never produce but a direct Helm user might write.
func TestChartSchemaRefusesBadValues(t *testing.T) {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, values, want string
	}{
		{"unknown engine", `{applications: {a: {model: {source: "hf://o/r"}, runtime: {engine: tgi}, serving: {maxConcurrency: 1}, scaling: {replicas: 1}}}}`, "engine"},
		{"bad application name", `{applications: {A_B: {model: {source: "hf://o/r"}, runtime: {engine: simulator}, serving: {maxConcurrency: 1}, scaling: {replicas: 1}}}}`, "A_B"},
		{"five nats servers", `{nats: {replicas: 5}}`, "replicas"},
		{"misspelt key", `{gateway: {replica: 2}}`, "replica"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tc.values), &vals); err != nil {
				t.Fatal(err)
			}
			coalesced, err := chartutil.CoalesceValues(c, vals)
			if err != nil {
				t.Fatal(err)
			}
			err = chartutil.ValidateAgainstSchema(c, coalesced)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}
