package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// WeightsNodeLabelPrefix is the prefix of the node labels that say which
// nodes hold a copy of an application's weights: one label per sleeping
// application, "weights.modelorchestra.io/<namespace>.<release>-<app>"
// (hash-shortened past 63 characters), with the value "hot" or "warm"
// (the hottest copy the node agent on that node reports). The lifecycle
// leader keeps them true; a root pod prefers a node that has one
// (docs/lifecycle.md, "Parking").
const WeightsNodeLabelPrefix = "weights.modelorchestra.io/"

// Values of a weights node label.
const (
	WeightsOnNodeHot  = "hot"
	WeightsOnNodeWarm = "warm"
)

// ParkedStatus says that an application is parked: asleep past
// lifecycle.parkAfter, its pods were scaled away (minReplicas 0) while the
// node agents keep copies of its weights. The next request wakes it from
// zero, preferring a node that holds a copy.
type ParkedStatus struct {
	// since is when the pods were scaled away.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// copies are the copies of the weights the node agents held when it
	// was last looked at, hottest first (at most 16).
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=16
	Copies []NodeCopy `json:"copies,omitempty"`

	// nodeLabel is the node label that marks the nodes holding a copy
	// (weights.modelorchestra.io/...: hot or warm), which a woken root
	// pod prefers; empty when the nodes are not labelled.
	// +optional
	NodeLabel string `json:"nodeLabel,omitempty"`
}

// NodeCopy is a copy of the weights on one node.
type NodeCopy struct {
	// node is the node's name.
	Node string `json:"node"`
	// tier is Hot or Warm.
	Tier Tier `json:"tier"`
}
