package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ModelOrchestra is an LLM serving stack: for every application a model
// cache filled by a fetch Job and an inference topology (a root and optional
// workers), in front of them one OpenAI-compatible gateway that checks
// tokens, and a NATS JetStream queue with a dispatcher that carries requests
// from the gateway to the engines.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=modelorchestras,singular=modelorchestra,shortName=mo;orchestra,categories=modelorchestra
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`,description="Whether every application serves and the gateway answers"
// +kubebuilder:printcolumn:name="Apps",type=string,JSONPath=`.status.readyApplications`,description="Ready applications out of all applications"
// +kubebuilder:printcolumn:name="Awake",type=string,JSONPath=`.status.awakeApplications`,description="Applications with awake engines out of all applications (the others are asleep or at zero pods and wake on the next request)"
// +kubebuilder:printcolumn:name="Endpoint",type=string,JSONPath=`.status.endpoint`,description="OpenAI-compatible base URL"
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.modelSize`,description="Model parameters, weight type, file size and estimated memory per application"
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 40",message="metadata.name must be at most 40 characters: it prefixes the names of every object of the stack"
// +kubebuilder:validation:XValidation:rule="self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS label that starts with a letter (lower-case letters, digits and '-'): it names the stack's Services"
type ModelOrchestra struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec describes the serving stack.
	// +required
	Spec ModelOrchestraSpec `json:"spec"`

	// status is written by the operator.
	// +optional
	Status ModelOrchestraStatus `json:"status,omitempty"`
}

// ModelOrchestraList is a list of ModelOrchestra.
//
// +kubebuilder:object:root=true
type ModelOrchestraList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelOrchestra `json:"items"`
}

// ModelOrchestraSpec is the desired serving stack.
//
// Applications of one seat group share an accelerator, so the rules below
// refuse what cannot share one: different GPU products or counts
// (distributed-llama, which cannot sleep, is refused per application).
// Node selectors that no single node satisfies are refused by the operator
// when it renders (and by orchestra template), not here: a rule over
// runtime.nodeSelector, an unbounded map, exceeds the API server's CEL cost
// budget, and bounding the map would refuse stored resources.
//
// +kubebuilder:validation:XValidation:rule="self.applications.all(n, !has(self.applications[n].lifecycle) || !has(self.applications[n].lifecycle.seat) || (has(self.seatGroups) && self.applications[n].lifecycle.seat.group in self.seatGroups))",message="lifecycle.seat.group must name a group in spec.seatGroups"
// +kubebuilder:validation:XValidation:rule="!has(self.seatGroups) || self.applications.all(a, !has(self.applications[a].lifecycle) || !has(self.applications[a].lifecycle.seat) || self.applications.all(b, !has(self.applications[b].lifecycle) || !has(self.applications[b].lifecycle.seat) || self.applications[b].lifecycle.seat.group != self.applications[a].lifecycle.seat.group || (has(self.applications[a].runtime.gpu.product) == has(self.applications[b].runtime.gpu.product) && (!has(self.applications[a].runtime.gpu.product) || self.applications[a].runtime.gpu.product == self.applications[b].runtime.gpu.product) && self.applications[a].runtime.gpu.count == self.applications[b].runtime.gpu.count)))",message="applications of one seat group share one accelerator: they must ask for the same runtime.gpu.count and runtime.gpu.product",fieldPath=".seatGroups"
// +kubebuilder:validation:XValidation:rule="!has(self.seatGroups) || self.applications.all(a, !has(self.applications[a].lifecycle) || !has(self.applications[a].lifecycle.seat) || !(self.applications[a].lifecycle.seat.group in self.seatGroups) || !has(self.seatGroups[self.applications[a].lifecycle.seat.group].replicas) || self.seatGroups[self.applications[a].lifecycle.seat.group].replicas <= 1 || self.applications[a].model.source.startsWith('pvc://') || !has(self.applications[a].model.cache) || !has(self.applications[a].model.cache.accessMode) || self.applications[a].model.cache.accessMode != 'ReadWriteOncePod')",message="seatGroups.<group>.replicas above 1 runs every application of the group in several pods: an application's model cache with accessMode ReadWriteOncePod admits one pod; use ReadWriteOnce or ReadWriteMany",fieldPath=".seatGroups"
type ModelOrchestraSpec struct {
	// imagePullSecrets are Secrets in the resource's namespace used to pull
	// every image of the stack (engines, gateway, dispatcher, fetcher, NATS).
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=16
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// nats is the NATS JetStream server that queues requests between the
	// gateway and the dispatcher. Without url the operator deploys one.
	// +optional
	// +kubebuilder:default={}
	NATS NATSSpec `json:"nats,omitempty"`

	// gateway is the OpenAI-compatible HTTP entry point.
	// +optional
	// +kubebuilder:default={}
	Gateway GatewaySpec `json:"gateway,omitempty"`

	// dispatcher takes queued requests and sends them to the engines.
	// +optional
	// +kubebuilder:default={}
	Dispatcher DispatcherSpec `json:"dispatcher,omitempty"`

	// applications are the models to serve, by application name. The name
	// is the routing key in the queue and, unless serving.servedModelName is
	// set, the model name clients ask for. Names are DNS labels of at most
	// 24 characters.
	// +required
	// +kubebuilder:validation:MinProperties=1
	// +kubebuilder:validation:MaxProperties=16
	// +kubebuilder:validation:XValidation:rule="self.all(name, size(name) <= 24 && name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$'))",message="application names must be lower-case DNS labels of at most 24 characters that start with a letter"
	Applications map[string]Application `json:"applications"`

	// seatGroups are accelerator seats shared by several applications, by
	// group name (see applications.<app>.lifecycle.seat).
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	SeatGroups map[string]SeatGroupSpec `json:"seatGroups,omitempty"`

	// agent places the checkpoint node agent, which runs while an
	// application sleeps. Defaults to the placement of the sleeping
	// applications' engines.
	// +optional
	Agent *AgentSpec `json:"agent,omitempty"`
}
