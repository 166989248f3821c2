package v1alpha1

import corev1 "k8s.io/api/core/v1"

// AgentSpec places the checkpoint node agent (orchestra-agent --role
// node), the DaemonSet that keeps the hot and warm copies of sleeping
// applications' weights on each node. It runs only while an application
// of the resource sleeps (lifecycle.sleep or lifecycle.seat).
//
// Without any of its fields, the agent goes where the sleeping
// applications' engines can go: the tolerations of their engine pods
// (runtime.tolerations, all of them), and a node affinity that admits a
// node when one of those applications could run there (its
// runtime.nodeSelector and runtime.affinity's required node affinity). With
// any of them set, the agent takes exactly these and nothing from the
// applications.
type AgentSpec struct {
	// nodeSelector constrains the node agent's pods to nodes with these
	// labels.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations of the node agent's pods, for example of the taints of
	// GPU nodes.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// affinity of the node agent's pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
}

// Placed reports whether any field of a is set.
func (a *AgentSpec) Placed() bool {
	return a != nil && (len(a.NodeSelector) > 0 || len(a.Tolerations) > 0 || a.Affinity != nil)
}
