package orchestra

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

func TestAgentPlacement(t *testing.T) {
	gpuTaint := corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	spot := corev1.Toleration{Key: "spot", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}
	app := func(sel map[string]string, tol []corev1.Toleration, aff *corev1.Affinity) v1alpha1.Application {
		return v1alpha1.Application{Runtime: v1alpha1.RuntimeSpec{NodeSelector: sel, Tolerations: tol, Affinity: aff}}
	}
	zoneAff := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a", "b"}}}}},
	}}, PodAntiAffinity: &corev1.PodAntiAffinity{}}
	term := func(reqs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
		return corev1.NodeSelectorTerm{MatchExpressions: reqs}
	}
	in := func(k string, v ...string) corev1.NodeSelectorRequirement {
		return corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: v}
	}
	required := func(terms ...corev1.NodeSelectorTerm) *corev1.Affinity {
		return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms}}}
	}
	for name, c := range map[string]struct {
		spec    v1alpha1.ModelOrchestraSpec
		names   []string
		wantSel map[string]string
		wantTol []corev1.Toleration
		wantAff *corev1.Affinity
	}{
		"no placement anywhere": {
			spec: v1alpha1.ModelOrchestraSpec{Applications: map[string]v1alpha1.Application{"a": app(nil, nil, nil)}}, names: []string{"a"},
		},
		"one GPU application: its selector and tolerations": {
			spec:    v1alpha1.ModelOrchestraSpec{Applications: map[string]v1alpha1.Application{"a": app(map[string]string{"gpu": "l4"}, []corev1.Toleration{gpuTaint}, nil)}},
			names:   []string{"a"},
			wantSel: map[string]string{"gpu": "l4"}, wantTol: []corev1.Toleration{gpuTaint},
		},
		"two selectors: either node, every toleration once": {
			spec: v1alpha1.ModelOrchestraSpec{Applications: map[string]v1alpha1.Application{
				"a": app(map[string]string{"gpu": "l4"}, []corev1.Toleration{gpuTaint}, nil),
				"b": app(map[string]string{"gpu": "h100", "pool": "x"}, []corev1.Toleration{gpuTaint, spot}, nil),
			}},
			names:   []string{"b", "a"},
			wantTol: []corev1.Toleration{gpuTaint, spot},
			wantAff: required(term(in("gpu", "l4")), term(in("gpu", "h100"), in("pool", "x"))),
		},
		"node affinity and selector are ANDed, pod anti-affinity dropped": {
			spec:    v1alpha1.ModelOrchestraSpec{Applications: map[string]v1alpha1.Application{"a": app(map[string]string{"gpu": "l4"}, nil, zoneAff)}},
			names:   []string{"a"},
			wantAff: required(term(in("zone", "a", "b"), in("gpu", "l4"))),
		},
		"an application that runs anywhere frees the agent": {
			spec: v1alpha1.ModelOrchestraSpec{Applications: map[string]v1alpha1.Application{
				"a": app(map[string]string{"gpu": "l4"}, []corev1.Toleration{gpuTaint}, nil),
				"b": app(nil, nil, nil),
			}},
			names:   []string{"a", "b"},
			wantTol: []corev1.Toleration{gpuTaint},
		},
		"applications that do not sleep are left out": {
			spec: v1alpha1.ModelOrchestraSpec{Applications: map[string]v1alpha1.Application{
				"a": app(map[string]string{"gpu": "l4"}, nil, nil),
				"b": app(nil, []corev1.Toleration{spot}, nil),
			}},
			names:   []string{"a"},
			wantSel: map[string]string{"gpu": "l4"},
		},
		"spec.agent wins whole": {
			spec: v1alpha1.ModelOrchestraSpec{
				Applications: map[string]v1alpha1.Application{"a": app(map[string]string{"gpu": "l4"}, []corev1.Toleration{gpuTaint}, nil)},
				Agent:        &v1alpha1.AgentSpec{Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}}},
			},
			names:   []string{"a"},
			wantTol: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			sel, tol, aff := agentPlacement(c.spec, c.names)
			if diff := cmp.Diff(c.wantSel, sel); diff != "" {
				t.Errorf("nodeSelector (-want +got)\n%s", diff)
			}
			if diff := cmp.Diff(c.wantTol, tol); diff != "" {
				t.Errorf("tolerations (-want +got)\n%s", diff)
			}
			if diff := cmp.Diff(c.wantAff, aff); diff != "" {
				t.Errorf("affinity (-want +got)\n%s", diff)
			}
		})
	}
}
