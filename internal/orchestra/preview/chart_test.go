package preview

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint/support"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/version"
)

// chartDir is the product's umbrella chart; its parts are subcharts in
// chartDir/charts, and libDir holds their shared named templates.
const (
	chartDir = "../../../charts/model-orchestra"
	libDir   = chartDir + "/charts/orchestra-lib"
)

// parts are the umbrella's subcharts that render objects.
var parts = []string{"model-cache", "topology", "gateway", "dispatcher", "nats", "agent"}

func ciValues(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "ci", "all-engines-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	return vals
}

// TestChartLint is `helm lint --strict` on the umbrella chart, with its
// default values and with its CI values that enable every engine and
// option, and on the library chart. The parts are linted through the
// umbrella, the only way they render.
func TestChartLint(t *testing.T) {
	for _, tc := range []struct {
		name, dir string
		vals      map[string]any
	}{
		{"umbrella/defaults", chartDir, map[string]any{}},
		{"umbrella/all engines", chartDir, ciValues(t)},
		{"library", libDir, map[string]any{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lint := action.NewLint()
			lint.Strict = true
			res := lint.Run([]string{tc.dir}, tc.vals)
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

// renderFiles is `helm template x <chartDir>` with vals: the rendered
// manifest of every template, by its path in the chart tree.
func renderFiles(t *testing.T, vals map[string]any) map[string]string {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: "x", Namespace: "ns", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	files, err := engine.Render(c, rv)
	if err != nil {
		t.Fatalf("rendering: %v", err)
	}
	return files
}

// TestEveryPartRendersThroughTheUmbrella: with the CI values each part's
// templates render objects through the umbrella, and the library renders
// none. The golden files pin what they render.
func TestEveryPartRendersThroughTheUmbrella(t *testing.T) {
	kinds := map[string][]string{}
	for name, content := range renderFiles(t, ciValues(t)) {
		if !strings.HasSuffix(name, ".yaml") {
			continue // NOTES.txt
		}
		part := "model-orchestra"
		if rest, ok := strings.CutPrefix(name, "model-orchestra/charts/"); ok {
			part, _, _ = strings.Cut(rest, "/")
		}
		for _, doc := range strings.Split(content, "\n---") {
			var obj struct{ Kind string }
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if obj.Kind != "" {
				kinds[part] = append(kinds[part], obj.Kind)
			}
		}
	}
	for _, p := range parts {
		if len(kinds[p]) == 0 {
			t.Errorf("part %s renders nothing through the umbrella", p)
		}
	}
	for p, k := range kinds {
		if !slices.Contains(parts, p) {
			t.Errorf("%s renders %v; only the parts %v render objects", p, k, parts)
		}
	}
}

var (
	defineRE = regexp.MustCompile(`{{-?\s*define\s+"([^"]+)"`)
	useRE    = regexp.MustCompile(`(?:include|template)\s+"([^"]+)"`)
)

// TestEachNamedTemplateHasOneSource: every named template is defined once
// in the chart tree, and one that a part defines is used by that part
// only (Helm shares the defines of the whole tree, so a part could call
// its sibling's); what several parts use lives in the library. Helm lets
// the last parsed of two equal defines win silently, so a copy would be a
// trap.
func TestEachNamedTemplateHasOneSource(t *testing.T) {
	type site struct{ chart, file string }
	defined := map[string][]site{}
	used := map[string]map[string]bool{}
	err := filepath.WalkDir(chartDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Base(filepath.Dir(path)) != "templates" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, path)
		chart := "model-orchestra"
		if rest, ok := strings.CutPrefix(filepath.ToSlash(rel), "charts/"); ok {
			chart, _, _ = strings.Cut(rest, "/")
		}
		for _, m := range defineRE.FindAllStringSubmatch(string(data), -1) {
			defined[m[1]] = append(defined[m[1]], site{chart, rel})
		}
		for _, m := range useRE.FindAllStringSubmatch(stripComments(string(data)), -1) {
			if used[m[1]] == nil {
				used[m[1]] = map[string]bool{}
			}
			used[m[1]][chart] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) == 0 {
		t.Fatal("found no named templates")
	}
	for name, sites := range defined {
		if len(sites) > 1 {
			t.Errorf("%s is defined %d times: %v", name, len(sites), sites)
		}
		owner := sites[0].chart
		if len(used[name]) == 0 {
			t.Errorf("%s (%s) is used nowhere", name, sites[0].file)
		}
		for user := range used[name] {
			if owner != "orchestra-lib" && user != owner {
				t.Errorf("%s is defined by %s but used by %s: move it to the orchestra-lib library chart", name, owner, user)
			}
		}
	}
	for name := range used {
		if _, ok := defined[name]; !ok {
			t.Errorf("%s is used but defined nowhere", name)
		}
	}
}

var commentRE = regexp.MustCompile(`(?s){{-?\s*/\*.*?\*/\s*-?}}`)

// stripComments removes template comments, whose usage examples are not
// uses.
func stripComments(s string) string { return commentRE.ReplaceAllString(s, "") }

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
		{"sleep level 3", `{global: {applications: {a: {model: {source: "hf://o/r"}, runtime: {engine: simulator}, serving: {maxConcurrency: 1}, scaling: {replicas: 1}, lifecycle: {minReplicas: 0, maxReplicas: 1, zeroAfter: 1h, targetQueuePerReplica: 1, maxWait: 5m, scaler: Builtin, sleep: {after: 5m, level: 3, slo: {resumeRamSeconds: 1, resumeNvmeSeconds: 5}}}}}}}`, "level"},
		{"sleep without an SLO", `{global: {applications: {a: {model: {source: "hf://o/r"}, runtime: {engine: simulator}, serving: {maxConcurrency: 1}, scaling: {replicas: 1}, lifecycle: {minReplicas: 0, maxReplicas: 1, zeroAfter: 1h, targetQueuePerReplica: 1, maxWait: 5m, scaler: Builtin, sleep: {after: 5m, level: 1}}}}}}`, "slo"},
		{"relative hot tier path", `{global: {agent: {enabled: true, hotPath: "shm/tiers", warmPath: /var/lib/w}}}`, "hotPath"},
		{"misspelt agent budget", `{agent: {hotMaxByte: 1GiB}}`, "hotMaxByte"},
		{"agent budget that is no size", `{agent: {hotMaxBytes: lots}}`, "hotMaxBytes"},
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
// subchart (the library too) carry the operator's version, the one the
// Makefile builds.
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
	umbrella, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(umbrella.Dependencies()) != len(parts)+1 {
		t.Errorf("the umbrella has %d subcharts, want the %d parts and the library", len(umbrella.Dependencies()), len(parts))
	}
	for _, c := range append([]*chart.Chart{umbrella}, umbrella.Dependencies()...) {
		if c.Metadata.Version != version.Version || c.Metadata.AppVersion != version.Version {
			t.Errorf("%s: version %s, appVersion %s, want the operator version %s", c.Name(), c.Metadata.Version, c.Metadata.AppVersion, version.Version)
		}
		for _, d := range c.Metadata.Dependencies {
			if d.Version != version.Version {
				t.Errorf("%s: dependency %s at %s, want %s", c.Name(), d.Name, d.Version, version.Version)
			}
		}
	}
	// A plain helm install (no operator to set the images) pulls our images
	// of the same release.
	global, _ := umbrella.Values["global"].(map[string]any)
	images, _ := global["images"].(map[string]any)
	if len(images) == 0 {
		t.Errorf("no global.images defaults")
	}
	for name, ref := range images {
		if !strings.HasPrefix(fmt.Sprint(ref), "ghcr.io/model-orchestra/") {
			continue // a third-party engine, pinned on its own
		}
		if !strings.HasSuffix(fmt.Sprint(ref), ":v"+version.Version) {
			t.Errorf("default image %s is %v, want the tag v%s", name, ref, version.Version)
		}
	}
}

// TestPartsTakeGlobalFromTheUmbrella: global is declared and checked in
// depth by the umbrella only; a part neither repeats its defaults nor its
// schema.
func TestPartsTakeGlobalFromTheUmbrella(t *testing.T) {
	umbrella, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range umbrella.Dependencies() {
		if _, ok := c.Values["global"]; ok {
			t.Errorf("%s/values.yaml sets global: the umbrella's values.yaml owns it", c.Name())
		}
		if c.Schema == nil {
			continue
		}
		var schema struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		if err := json.Unmarshal(c.Schema, &schema); err != nil {
			t.Fatalf("%s/values.schema.json: %v", c.Name(), err)
		}
		if g := schema.Properties["global"]; g["type"] != "object" || g["properties"] != nil {
			t.Errorf("%s/values.schema.json checks global itself (%v): the umbrella's schema owns it", c.Name(), g)
		}
	}
}
