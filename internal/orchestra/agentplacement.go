package orchestra

import (
	"fmt"
	"reflect"
	"sort"

	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// agentPlacement is where the node agent runs: spec.agent when any of its
// fields is set, otherwise where the engines of the sleeping applications
// (names) can run, so that it reaches a tainted GPU node that runs one of
// them and no node that none of them can run on:
//   - tolerations: every toleration of those engines;
//   - nodes: a node affinity whose terms are ORed: one term per required
//     node-affinity term of each application (one empty term without
//     any), with the application's nodeSelector added to it as In
//     expressions. An application with neither constrains nothing, and so
//     the agent may run on every node its tolerations admit. When every
//     application has the same nodeSelector and no node affinity, that
//     nodeSelector is used as it is.
//
// Engine pod (anti-)affinity is not carried over: it places engines
// relative to each other, which means nothing for a DaemonSet.
func agentPlacement(s v1alpha1.ModelOrchestraSpec, names []string) (nodeSelector map[string]string, tolerations []corev1.Toleration, affinity *corev1.Affinity) {
	if s.Agent.Placed() {
		return s.Agent.NodeSelector, s.Agent.Tolerations, s.Agent.Affinity
	}
	sort.Strings(names)
	var terms []corev1.NodeSelectorTerm
	unconstrained := false
	sameSelector := true
	for i, name := range names {
		rt := s.Applications[name].Runtime
		for _, t := range rt.Tolerations {
			if !containsToleration(tolerations, t) {
				tolerations = append(tolerations, t)
			}
		}
		var required []corev1.NodeSelectorTerm
		if a := rt.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
			required = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
		}
		if len(required) > 0 || (i > 0 && !reflect.DeepEqual(rt.NodeSelector, s.Applications[names[0]].Runtime.NodeSelector)) {
			sameSelector = false
		}
		if len(required) == 0 {
			required = []corev1.NodeSelectorTerm{{}}
		}
		for _, t := range required {
			t = *t.DeepCopy()
			keys := make([]string, 0, len(rt.NodeSelector))
			for k := range rt.NodeSelector {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				t.MatchExpressions = append(t.MatchExpressions, corev1.NodeSelectorRequirement{Key: k, Operator: corev1.NodeSelectorOpIn, Values: []string{rt.NodeSelector[k]}})
			}
			if len(t.MatchExpressions) == 0 && len(t.MatchFields) == 0 {
				unconstrained = true
			}
			if !containsTerm(terms, t) {
				terms = append(terms, t)
			}
		}
	}
	switch {
	case unconstrained || len(names) == 0:
		return nil, tolerations, nil
	case sameSelector:
		return s.Applications[names[0]].Runtime.NodeSelector, tolerations, nil
	}
	return nil, tolerations, &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
		RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: terms},
	}}
}

func containsToleration(ts []corev1.Toleration, t corev1.Toleration) bool {
	for _, x := range ts {
		if reflect.DeepEqual(x, t) {
			return true
		}
	}
	return false
}

func containsTerm(ts []corev1.NodeSelectorTerm, t corev1.NodeSelectorTerm) bool {
	for _, x := range ts {
		if reflect.DeepEqual(x, t) {
			return true
		}
	}
	return false
}

// agentValues are the agent part's placement values (charts/agent's
// nodeSelector, tolerations, affinity) for the sleeping applications names.
func agentValues(s v1alpha1.ModelOrchestraSpec, names []string) (map[string]any, error) {
	ns, tol, aff := agentPlacement(s, names)
	out := map[string]any{}
	if len(ns) > 0 {
		m := map[string]any{}
		for k, v := range ns {
			m[k] = v
		}
		out["nodeSelector"] = m
	}
	if len(tol) > 0 {
		v, err := toJSONValue(tol)
		if err != nil {
			return nil, fmt.Errorf("the agent's tolerations: %w", err)
		}
		out["tolerations"] = v
	}
	if aff != nil {
		v, err := toJSONValue(aff)
		if err != nil {
			return nil, fmt.Errorf("the agent's affinity: %w", err)
		}
		out["affinity"] = v
	}
	return out, nil
}
