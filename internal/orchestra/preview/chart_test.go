package preview

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/version"
)

// chartDir is the product's umbrella chart; its subcharts are in
// chartDir/charts.
const chartDir = "../../../charts/model-orchestra"

// subcharts are the umbrella's parts, each a chart of its own.
var subcharts = []string{"model-cache", "topology", "gateway", "dispatcher", "nats"}

// chartDirs are the umbrella and every subchart.
func chartDirs() []string {
	dirs := []string{chartDir}
	for _, s := range subcharts {
		dirs = append(dirs, filepath.Join(chartDir, "charts", s))
	}
	return dirs
}

func ciValues(t *testing.T, dir string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "ci", "all-engines-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	return vals
}

// TestChartLint is `helm lint --strict` on the umbrella chart and on every
// subchart on its own, with its default values and with its CI values that
// enable every engine and option.
func TestChartLint(t *testing.T) {
	for _, dir := range chartDirs() {
		for name, vals := range map[string]map[string]any{"defaults": {}, "all engines": ciValues(t, dir)} {
			t.Run(filepath.Base(dir)+"/"+name, func(t *testing.T) {
				lint := action.NewLint()
				lint.Strict = true
				res := lint.Run([]string{dir}, vals)
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
}

// chartLabel is the only label that differs between a subchart rendered
// through the umbrella and on its own (it names the chart that rendered it).
var chartLabel = regexp.MustCompile(`(?m)^\s*helm\.sh/chart: .*\n`)

// renderObjects is `helm template x <dir>` with vals: the rendered objects
// by "<kind> <name>", without the helm.sh/chart label.
func renderObjects(t *testing.T, dir string, vals map[string]any) map[string]map[string]any {
	t.Helper()
	c, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: "x", Namespace: "ns", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatalf("values of %s: %v", dir, err)
	}
	files, err := engine.Render(c, rv)
	if err != nil {
		t.Fatalf("rendering %s: %v", dir, err)
	}
	objs := map[string]map[string]any{}
	for name, content := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for _, doc := range strings.Split(chartLabel.ReplaceAllString(content, ""), "\n---") {
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if obj == nil {
				continue
			}
			meta, _ := obj["metadata"].(map[string]any)
			key := obj["kind"].(string) + " " + meta["name"].(string)
			if _, dup := objs[key]; dup {
				t.Fatalf("%s renders %s twice", dir, key)
			}
			objs[key] = obj
		}
	}
	return objs
}

// TestSubchartsRenderOnTheirOwn: every subchart renders with its own CI
// values alone, and together they render exactly what the umbrella renders
// with its CI values (the same application per engine).
func TestSubchartsRenderOnTheirOwn(t *testing.T) {
	want := renderObjects(t, chartDir, ciValues(t, chartDir))
	got := map[string]map[string]any{}
	for _, s := range subcharts {
		dir := filepath.Join(chartDir, "charts", s)
		objs := renderObjects(t, dir, ciValues(t, dir))
		if len(objs) == 0 {
			t.Errorf("%s renders nothing with its CI values", s)
		}
		for k, o := range objs {
			got[k] = o
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the subcharts on their own differ from the umbrella (-umbrella +subcharts):\n%s", diff)
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
		{"unknown engine", `{global: {applications: {a: {model: {source: "hf://o/r"}, runtime: {engine: tgi}, serving: {maxConcurrency: 1}, scaling: {replicas: 1}}}}}`, "engine"},
		{"bad application name", `{global: {applications: {A_B: {model: {source: "hf://o/r"}, runtime: {engine: simulator}, serving: {maxConcurrency: 1}, scaling: {replicas: 1}}}}}`, "A_B"},
		{"five nats servers", `{global: {nats: {replicas: 5}}}`, "replicas"},
		{"misspelt gateway key", `{gateway: {replica: 2}}`, "replica"},
		{"misspelt global key", `{global: {application: {}}}`, "application"},
		{"nats storage without size", `{nats: {storage: {size: ""}}}`, "size"},
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

// TestChartVersionIsTheOperatorVersion: the umbrella chart and every
// subchart carry the operator's version, the one the Makefile builds.
func TestChartVersionIsTheOperatorVersion(t *testing.T) {
	mk, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION \?= (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("no VERSION ?= line in the Makefile")
	}
	if string(m[1]) != version.Version {
		t.Errorf("Makefile VERSION %s, internal/version.Version %s: they must agree", m[1], version.Version)
	}
	for _, dir := range chartDirs() {
		c, err := loader.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if c.Metadata.Version != version.Version || c.Metadata.AppVersion != version.Version {
			t.Errorf("%s: version %s, appVersion %s, want the operator version %s", c.Name(), c.Metadata.Version, c.Metadata.AppVersion, version.Version)
		}
		for _, d := range c.Metadata.Dependencies {
			if d.Version != version.Version {
				t.Errorf("%s: dependency %s at %s, want %s", c.Name(), d.Name, d.Version, version.Version)
			}
		}
		// A plain helm install (no operator to set the images) pulls our
		// images of the same release.
		global, _ := c.Values["global"].(map[string]any)
		images, _ := global["images"].(map[string]any)
		if len(images) == 0 {
			t.Errorf("%s: no global.images defaults", c.Name())
		}
		for name, ref := range images {
			if !strings.HasPrefix(fmt.Sprint(ref), "ghcr.io/model-orchestra/") {
				continue // a third-party engine, pinned on its own
			}
			if !strings.HasSuffix(fmt.Sprint(ref), ":v"+version.Version) {
				t.Errorf("%s: default image %s is %v, want the tag v%s", c.Name(), name, ref, version.Version)
			}
		}
	}
}

// TestSubchartsShareTheUmbrellaGlobals: what makes a subchart render on its
// own (its copy of the global defaults, of their schema and of the shared
// named templates) is the umbrella's, so a subchart renders the same alone
// and through the umbrella. `make chart-helpers` refreshes the templates.
func TestSubchartsShareTheUmbrellaGlobals(t *testing.T) {
	read := func(path string) []byte {
		t.Helper()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	global := func(path string) any {
		t.Helper()
		var m map[string]any
		if err := yaml.Unmarshal(read(path), &m); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if path = filepath.Base(path); path == "values.schema.json" {
			return m["properties"].(map[string]any)["global"]
		}
		return m["global"]
	}
	for _, s := range subcharts {
		dir := filepath.Join(chartDir, "charts", s)
		for _, f := range []string{"values.yaml", "values.schema.json"} {
			if diff := cmp.Diff(global(filepath.Join(chartDir, f)), global(filepath.Join(dir, f))); diff != "" {
				t.Errorf("global in %s/%s differs from the umbrella's (-umbrella +%s):\n%s", s, f, s, diff)
			}
		}
		for _, f := range []string{"_helpers.tpl", "_engines.tpl"} {
			src := string(read(filepath.Join(chartDir, "templates", f)))
			copied := string(read(filepath.Join(dir, "templates", f)))
			if _, body, _ := strings.Cut(copied, "\n"); body != src {
				t.Errorf("%s/templates/%s is not a copy of the umbrella's (run make chart-helpers)", s, f)
			}
		}
	}
}
