package preview

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// weightsTerms are the preferred node affinity terms a sleeping
// application's root pods carry for its weights node label.
func weightsTerms(key string) []corev1.PreferredSchedulingTerm {
	term := func(w int32, v string) corev1.PreferredSchedulingTerm {
		return corev1.PreferredSchedulingTerm{Weight: w, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
			{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{v}}}}}
	}
	return []corev1.PreferredSchedulingTerm{term(100, v1alpha1.WeightsOnNodeHot), term(50, v1alpha1.WeightsOnNodeWarm)}
}

// dispatcherNodeLabels are the node labels of the dispatcher's
// configuration, by application.
func dispatcherNodeLabels(t *testing.T, objs rendered) map[string]string {
	t.Helper()
	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-dispatcher", &cm)
	var cfg struct {
		Lifecycle struct {
			Apps []struct {
				Name  string `json:"name"`
				Sleep *struct {
					NodeLabel string `json:"nodeLabel"`
				} `json:"sleep"`
			} `json:"apps"`
		} `json:"lifecycle"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["dispatcher.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range cfg.Lifecycle.Apps {
		if a.Sleep != nil {
			out[a.Name] = a.Sleep.NodeLabel
		}
	}
	return out
}

// TestWokenRootsPreferTheNodesHoldingTheirWeights: every sleeping
// application's root pods carry a static preferred node affinity on the
// node label the dispatcher keeps (the same key, rendered once), hot
// before warm, added to the application's own affinity; an application
// that does not sleep carries none.
func TestWokenRootsPreferTheNodesHoldingTheirWeights(t *testing.T) {
	vals := readValues(t, sleepValues)
	// The simulator brings an affinity of its own: it is kept.
	own := map[string]any{
		"nodeAffinity": map[string]any{
			"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{
				map[string]any{"key": "pool", "operator": "In", "values": []any{"gpu"}}}}}},
			"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"weight": int64(10), "preference": map[string]any{"matchExpressions": []any{
				map[string]any{"key": "zone", "operator": "In", "values": []any{"a"}}}}}},
		},
		"podAntiAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{"weight": int64(1), "podAffinityTerm": map[string]any{
			"topologyKey": "kubernetes.io/hostname", "labelSelector": map[string]any{"matchLabels": map[string]any{"a": "b"}}}}}},
	}
	apps := vals["global"].(map[string]any)["applications"].(map[string]any)
	apps["sim"].(map[string]any)["runtime"].(map[string]any)["affinity"] = own
	objs := renderObjects(t, vals)
	labels := dispatcherNodeLabels(t, objs)

	sleeping := 0
	for app, spec := range apps {
		var sts appsv1.StatefulSet
		objs.get(t, "StatefulSet", "x-"+app, &sts)
		aff := sts.Spec.Template.Spec.Affinity
		lc, _ := spec.(map[string]any)["lifecycle"].(map[string]any)
		if lc == nil || lc["sleep"] == nil {
			if aff != nil && aff.NodeAffinity != nil {
				t.Errorf("%s does not sleep, yet its roots carry a node affinity: %+v", app, aff.NodeAffinity)
			}
			if _, ok := labels[app]; ok {
				t.Errorf("%s does not sleep, yet the dispatcher labels nodes for it", app)
			}
			continue
		}
		sleeping++
		key := labels[app]
		if key != "weights.modelorchestra.io/ns.x-"+app {
			t.Errorf("%s: the dispatcher's nodeLabel is %q, want weights.modelorchestra.io/ns.x-%s", app, key, app)
		}
		if aff == nil || aff.NodeAffinity == nil {
			t.Fatalf("%s: no node affinity on its root pods", app)
		}
		want := weightsTerms(key)
		if app == "sim" {
			want = append([]corev1.PreferredSchedulingTerm{{Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}, want...)
			if r := aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution; r == nil || len(r.NodeSelectorTerms) != 1 || r.NodeSelectorTerms[0].MatchExpressions[0].Key != "pool" {
				t.Errorf("sim: its own required node affinity was not kept: %+v", r)
			}
			if aff.PodAntiAffinity == nil || len(aff.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
				t.Errorf("sim: its own pod anti-affinity was not kept: %+v", aff.PodAntiAffinity)
			}
		}
		if diff := cmp.Diff(want, aff.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution); diff != "" {
			t.Errorf("%s: preferred node affinity (-want +got):\n%s", app, diff)
		}
	}
	if sleeping < 4 {
		t.Fatalf("%d sleeping applications rendered, want the four of %s", sleeping, sleepValues)
	}
}

// TestWeightsNodeLabelFitsALabelKey: a long namespace and name are cut
// and hashed into a valid label key, the same in the pod affinity and in
// the dispatcher's configuration, and different for two releases whose
// cut names agree.
func TestWeightsNodeLabelFitsALabelKey(t *testing.T) {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	ns := strings.Repeat("team-", 11) + "ab" // 57 characters
	keysOf := func(release string) (dispatcher, affinity map[string]bool) {
		rv, err := chartutil.ToRenderValues(c, readValues(t, sleepValues), chartutil.ReleaseOptions{Name: release, Namespace: ns, IsInstall: true}, chartutil.DefaultCapabilities)
		if err != nil {
			t.Fatal(err)
		}
		files, err := engine.Render(c, rv)
		if err != nil {
			t.Fatal(err)
		}
		dispatcher, affinity = map[string]bool{}, map[string]bool{}
		for name, content := range files {
			for _, line := range strings.Split(content, "\n") {
				l := strings.TrimSpace(line)
				if strings.Contains(name, "dispatcher") && strings.HasPrefix(l, "nodeLabel:") {
					dispatcher[strings.Trim(strings.TrimPrefix(l, "nodeLabel: "), `"`)] = true
				}
				if strings.Contains(name, "topology") && strings.HasPrefix(l, "- key: "+v1alpha1.WeightsNodeLabelPrefix) {
					affinity[strings.TrimPrefix(l, "- key: ")] = true
				}
			}
		}
		return dispatcher, affinity
	}
	d1, a1 := keysOf("release-one")
	d2, _ := keysOf("release-two")
	if len(d1) != 4 {
		t.Fatalf("%d distinct node labels for the four sleeping applications: %v", len(d1), d1)
	}
	if diff := cmp.Diff(d1, a1); diff != "" {
		t.Errorf("the dispatcher's node labels and the affinity's keys differ (-dispatcher +affinity):\n%s", diff)
	}
	for k := range d1 {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%q is not a label key: %v", k, errs)
		}
		if d2[k] {
			t.Errorf("two releases share the label key %q", k)
		}
		if !strings.HasPrefix(k, v1alpha1.WeightsNodeLabelPrefix+ns[:20]) {
			t.Errorf("%q does not start with the prefix and the namespace", k)
		}
	}
}
