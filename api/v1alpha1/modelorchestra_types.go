package v1alpha1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

// NATSSpec selects the NATS JetStream server.
//
// +kubebuilder:validation:XValidation:rule="has(self.url) || !has(self.credentialsSecretRef)",message="credentialsSecretRef is only used with an external url; the in-cluster server accepts the stack's pods only",fieldPath=".credentialsSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.url) || !has(self.storage)",message="storage applies to the in-cluster server only; remove it or remove url",fieldPath=".storage"
// +kubebuilder:validation:XValidation:rule="has(self.url) || has(oldSelf.url) || quantity(string(has(self.storage) ? self.storage.size : '10Gi')).compareTo(quantity(string(has(oldSelf.storage) ? oldSelf.storage.size : '10Gi'))) == 0",message="nats.storage.size cannot be changed in place: it sizes the volumes of the NATS StatefulSet (volumeClaimTemplates), which Kubernetes does not resize; keep the old size (the default is 10Gi), or delete and recreate the resource",fieldPath=".storage.size"
// +kubebuilder:validation:XValidation:rule="has(self.url) || has(oldSelf.url) || (has(self.storage) && has(self.storage.storageClassName) ? self.storage.storageClassName : '(default)') == (has(oldSelf.storage) && has(oldSelf.storage.storageClassName) ? oldSelf.storage.storageClassName : '(default)')",message="nats.storage.storageClassName cannot be changed in place: it is part of the NATS StatefulSet's volumeClaimTemplates, which Kubernetes does not change; delete and recreate the resource",fieldPath=".storage.storageClassName"
type NATSSpec struct {
	// url of an external NATS server with JetStream enabled, for example
	// nats://nats.messaging:4222 (several URLs separated by commas). When
	// empty the operator deploys a JetStream StatefulSet.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches('^(nats|tls|ws|wss)://[^ ,]+(,(nats|tls|ws|wss)://[^ ,]+)*$')",message="url must be one or more comma-separated nats://, tls://, ws:// or wss:// URLs"
	URL string `json:"url,omitempty"`

	// credentialsSecretRef names a Secret holding the credentials for the
	// external server under the key "creds" (a NATS credentials file with
	// the user JWT and NKey seed). Every component uses these credentials.
	// +optional
	CredentialsSecretRef *corev1.LocalObjectReference `json:"credentialsSecretRef,omitempty"`

	// replicas is the number of in-cluster NATS servers: 1 (a single
	// server) or 3 (a JetStream cluster that survives the loss of one). The
	// stack's streams are replicated this many times; with an external url
	// it is the stream replica count on that cluster.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Enum=1;3
	Replicas int32 `json:"replicas,omitempty"`

	// storage is the persistent volume of each in-cluster server: 10Gi of
	// the default storage class unless set. JetStream may use all of it
	// (max_file_store), and it must be at least 2Gi: the request stream
	// reserves 1Gi and the dead-letter stream needs room beside it. Size
	// and storageClassName cannot be changed once the resource exists (a
	// StatefulSet cannot change its volumeClaimTemplates).
	// +optional
	Storage *VolumeSpec `json:"storage,omitempty"`

	// resources of each in-cluster server container. Defaults to requests of
	// 100m CPU and 256Mi memory and a 1Gi memory limit.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// VolumeSpec sizes a PersistentVolumeClaim.
type VolumeSpec struct {
	// size of the volume. For NATS at least 2Gi; it cannot be changed once
	// the resource exists.
	// +optional
	// +kubebuilder:default="10Gi"
	Size resource.Quantity `json:"size,omitempty"`

	// storageClassName of the volume; empty uses the cluster's default class.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName,omitempty"`
}

// GatewaySpec configures the OpenAI-compatible gateway.
type GatewaySpec struct {
	// replicas of the gateway Deployment. With more than one a
	// PodDisruptionBudget keeps at least one running.
	// +optional
	// +kubebuilder:default=2
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=50
	Replicas int32 `json:"replicas,omitempty"`

	// service exposes the gateway.
	// +optional
	// +kubebuilder:default={}
	Service GatewayServiceSpec `json:"service,omitempty"`

	// ingress optionally exposes the gateway through a networking.k8s.io
	// Ingress.
	// +optional
	Ingress *IngressSpec `json:"ingress,omitempty"`

	// httpRoute optionally exposes the gateway through a Gateway API
	// HTTPRoute (gateway.networking.k8s.io/v1).
	// +optional
	HTTPRoute *HTTPRouteSpec `json:"httpRoute,omitempty"`

	// auth decides which requests are accepted.
	// +optional
	// +kubebuilder:default={}
	Auth GatewayAuthSpec `json:"auth,omitempty"`

	// limits protect the engines from overload.
	// +optional
	// +kubebuilder:default={}
	Limits GatewayLimitsSpec `json:"limits,omitempty"`

	// resources of the gateway container. Defaults to requests of 100m CPU
	// and 128Mi memory and a 512Mi memory limit.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// responses configures the Responses API's stored responses.
	// +optional
	Responses GatewayResponsesSpec `json:"responses,omitempty"`
}

// GatewayResponsesSpec configures how long the gateway keeps the responses
// clients store with the Responses API (store: true, the default), which
// previous_response_id continues. They are kept in a JetStream key-value
// bucket of the orchestra's NATS, per API token name.
type GatewayResponsesSpec struct {
	// retention is how long a stored response and its conversation are
	// kept after they were stored. Default: DefaultResponsesRetention
	// (720h, 30 days, as OpenAI keeps them).
	// +optional
	Retention *metav1.Duration `json:"retention,omitempty"`
}

// DefaultResponsesRetention is the retention of stored responses when
// spec.gateway.responses.retention is not set. It is declared here only:
// the gateway's configuration default uses it.
const DefaultResponsesRetention = 720 * time.Hour

// ServiceType is how the gateway Service is exposed.
// +kubebuilder:validation:Enum=ClusterIP;NodePort;LoadBalancer
type ServiceType string

// GatewayServiceSpec is the gateway's Service.
//
// +kubebuilder:validation:XValidation:rule="!has(self.nodePort) || self.type != 'ClusterIP'",message="nodePort needs type NodePort or LoadBalancer",fieldPath=".nodePort"
type GatewayServiceSpec struct {
	// type of the Service.
	// +optional
	// +kubebuilder:default=ClusterIP
	Type ServiceType `json:"type,omitempty"`

	// port the Service listens on.
	// +optional
	// +kubebuilder:default=80
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`

	// nodePort for type NodePort or LoadBalancer; empty lets Kubernetes pick.
	// +optional
	// +kubebuilder:validation:Minimum=30000
	// +kubebuilder:validation:Maximum=32767
	NodePort int32 `json:"nodePort,omitempty"`

	// annotations added to the Service, for example for a cloud load
	// balancer.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// IngressSpec is the gateway's optional Ingress.
type IngressSpec struct {
	// className is the IngressClass; empty uses the cluster's default.
	// +optional
	ClassName string `json:"className,omitempty"`

	// host the Ingress answers for; empty answers for every host.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Host string `json:"host,omitempty"`

	// path prefix routed to the gateway.
	// +optional
	// +kubebuilder:default="/"
	// +kubebuilder:validation:Pattern=`^/`
	Path string `json:"path,omitempty"`

	// tlsSecretName is a Secret of type kubernetes.io/tls for host; empty
	// serves plain HTTP.
	// +optional
	TLSSecretName string `json:"tlsSecretName,omitempty"`

	// annotations added to the Ingress.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// HTTPRouteSpec is the gateway's optional Gateway API HTTPRoute.
type HTTPRouteSpec struct {
	// parentRefs are the Gateways the route attaches to.
	// +required
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	ParentRefs []ParentReference `json:"parentRefs"`

	// hostnames the route matches; empty matches the Gateway's listeners.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	Hostnames []string `json:"hostnames,omitempty"`

	// path prefix routed to the gateway.
	// +optional
	// +kubebuilder:default="/"
	// +kubebuilder:validation:Pattern=`^/`
	Path string `json:"path,omitempty"`
}

// ParentReference names a Gateway API Gateway.
type ParentReference struct {
	// name of the Gateway.
	// +required
	// +kubebuilder:validation:MinLength=1
	Name string `json:"name"`

	// namespace of the Gateway; empty is the resource's namespace.
	// +optional
	Namespace string `json:"namespace,omitempty"`

	// sectionName is the listener of the Gateway to attach to.
	// +optional
	SectionName string `json:"sectionName,omitempty"`
}

// GatewayAuthSpec decides which requests the gateway accepts.
//
// +kubebuilder:validation:XValidation:rule="!self.anonymous || !has(self.tokenSecretSelector)",message="tokenSecretSelector has no effect when anonymous is true",fieldPath=".tokenSecretSelector"
type GatewayAuthSpec struct {
	// anonymous accepts requests without a bearer token. Use it only behind
	// another authenticating proxy.
	// +optional
	// +kubebuilder:default=false
	Anonymous bool `json:"anonymous,omitempty"`

	// tokenSecretSelector selects the Secrets in the resource's namespace
	// whose "token" key is an accepted API key. Defaults to Secrets labelled
	// modelorchestra.io/api-token=true. A Secret whose key "disabled" is
	// "true" is refused.
	// +optional
	TokenSecretSelector *metav1.LabelSelector `json:"tokenSecretSelector,omitempty"`

	// hmacKeySecretRef is a Secret key holding a key used to hash tokens
	// (HMAC-SHA256) before they are stored or logged; without it plain
	// SHA-256 is used.
	// +optional
	HMACKeySecretRef *SecretKeyRef `json:"hmacKeySecretRef,omitempty"`
}

// DefaultTokenSecretSelector is the label selector of the API token Secrets
// when spec.gateway.auth.tokenSecretSelector is not set. It is declared here
// only: the values translator and the gateway's own default use it.
const DefaultTokenSecretSelector = "modelorchestra.io/api-token=true"

// GatewayLimitsSpec protects the engines from overload. Zero means no
// limit.
type GatewayLimitsSpec struct {
	// requestsPerMinute each token may send; 0 is unlimited.
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=0
	RequestsPerMinute int32 `json:"requestsPerMinute,omitempty"`

	// tokensPerMinute (prompt plus completion tokens, estimated) each token
	// may use; 0 is unlimited.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	TokensPerMinute int32 `json:"tokensPerMinute,omitempty"`

	// maxConcurrent is how many streaming requests each token may have in
	// flight at once; further ones get HTTP 429. 0 is unlimited.
	// +optional
	// +kubebuilder:default=16
	// +kubebuilder:validation:Minimum=0
	MaxConcurrent int32 `json:"maxConcurrent,omitempty"`

	// maxBodySize is the largest request body accepted.
	// +optional
	// +kubebuilder:default="8Mi"
	MaxBodySize resource.Quantity `json:"maxBodySize,omitempty"`
}

// DispatcherSpec configures the dispatcher.
type DispatcherSpec struct {
	// replicas of the dispatcher Deployment. Replicas share the queue.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=20
	Replicas int32 `json:"replicas,omitempty"`

	// resources of the dispatcher container. Defaults to requests of 50m
	// CPU and 64Mi memory and a 256Mi memory limit.
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`
}

// Application is one served model.
//
// +kubebuilder:validation:XValidation:rule="self.runtime.engine != 'dllama' || [1, 2, 4, 8, 16, 32, 64].exists(n, n == self.runtime.workers + 1)",message="distributed-llama needs root plus workers to be a power of two: workers must be 0, 1, 3, 7, 15, 31 or 63",fieldPath=".runtime.workers"
// +kubebuilder:validation:XValidation:rule="self.runtime.workers == 0 || self.runtime.engine in ['llamacpp', 'dllama', 'vllm']",message="workers are supported by the llamacpp, dllama and vllm engines only",fieldPath=".runtime.workers"
// +kubebuilder:validation:XValidation:rule="!has(self.model.format) || self.runtime.engine == 'simulator' || (self.runtime.engine in ['llamacpp', 'ollama'] && self.model.format == 'gguf') || (self.runtime.engine == 'dllama' && self.model.format == 'dllama') || (self.runtime.engine == 'vllm' && self.model.format in ['safetensors', 'gguf']) || (self.runtime.engine in ['llamacpp', 'ollama'] && self.model.format == 'safetensors' && has(self.model.convert))",message="format does not fit the engine: llamacpp and ollama load gguf (or safetensors with model.convert), dllama loads dllama, vllm loads safetensors or gguf",fieldPath=".model.format"
// +kubebuilder:validation:XValidation:rule="!has(self.model.convert) || self.runtime.engine in ['llamacpp', 'ollama', 'simulator']",message="model.convert writes a GGUF file: only the llamacpp and ollama engines (and the simulator) load it",fieldPath=".model.convert"
// +kubebuilder:validation:XValidation:rule="!(self.runtime.engine in ['llamacpp', 'ollama', 'dllama'] || (self.runtime.engine == 'vllm' && has(self.model.format) && self.model.format == 'gguf')) || has(self.model.file) || has(self.model.convert)",message="file is required: the engine loads one model file (for example model-Q4_K_M.gguf)",fieldPath=".model.file"
// +kubebuilder:validation:XValidation:rule="self.runtime.engine != 'dllama' || has(self.model.tokenizerFile)",message="tokenizerFile is required by the dllama engine",fieldPath=".model.tokenizerFile"
// +kubebuilder:validation:XValidation:rule="self.runtime.engine != 'vllm' || self.runtime.workers == 0 || self.model.source.startsWith('pvc://') || (has(self.model.cache) && (has(self.model.cache.existingClaim) || (has(self.model.cache.accessMode) && self.model.cache.accessMode == 'ReadWriteMany')))",message="multi-node vllm reads the model on every node: set cache.accessMode ReadWriteMany, an existingClaim or a pvc:// source",fieldPath=".model.cache"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.sleepAfter) || self.runtime.engine != 'dllama'",message="distributed-llama cannot sleep (it has no sleep or unload API): remove lifecycle.sleepAfter",fieldPath=".lifecycle.sleepAfter"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.checkpointPolicy) || self.runtime.engine != 'dllama'",message="distributed-llama cannot sleep (it has no sleep or unload API): remove lifecycle.checkpointPolicy",fieldPath=".lifecycle.checkpointPolicy"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.seat) || self.runtime.engine != 'dllama'",message="distributed-llama cannot share an accelerator seat (it cannot sleep to free it): remove lifecycle.seat",fieldPath=".lifecycle.seat"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.maxReplicas) || self.lifecycle.maxReplicas <= 1 || self.model.source.startsWith('pvc://') || !has(self.model.cache) || !has(self.model.cache.accessMode) || self.model.cache.accessMode != 'ReadWriteOncePod'",message="lifecycle.maxReplicas above 1 needs a model cache that several pods can mount: a ReadWriteOncePod claim admits one pod; use ReadWriteOnce or ReadWriteMany",fieldPath=".lifecycle.maxReplicas"
type Application struct {
	// model is what to serve and where it comes from.
	// +required
	Model ModelSpec `json:"model"`

	// runtime is the inference engine and where it runs.
	// +optional
	// +kubebuilder:default={}
	Runtime RuntimeSpec `json:"runtime,omitempty"`

	// serving is how the model is offered to clients.
	// +optional
	// +kubebuilder:default={}
	Serving ServingSpec `json:"serving,omitempty"`

	// scaling is how many copies of the topology run.
	// +optional
	// +kubebuilder:default={}
	Scaling ScalingSpec `json:"scaling,omitempty"`

	// lifecycle scales the application with its demand, down to zero pods
	// when idle; without it scaling.replicas is the fixed size, which it
	// then replaces.
	// +optional
	Lifecycle *LifecycleSpec `json:"lifecycle,omitempty"`
}

// ModelFormat is the on-disk format of the model files.
// +kubebuilder:validation:Enum=gguf;safetensors;dllama
type ModelFormat string

// Model formats.
const (
	ModelFormatGGUF        ModelFormat = "gguf"
	ModelFormatSafetensors ModelFormat = "safetensors"
	ModelFormatDllama      ModelFormat = "dllama"
)

// ModelSpec says which model to serve and where it comes from.
//
// The claim the operator creates for the cache (no pvc:// source, no
// existingClaim) keeps its storage class and access mode: a
// PersistentVolumeClaim cannot change them. Its size is not checked here
// (a quantity rule inside the applications map exceeds the CEL cost
// budget): a smaller size fails the upgrade with the API server's message.
//
// +kubebuilder:validation:XValidation:rule="self.source.startsWith('pvc://') || (has(self.cache) && has(self.cache.existingClaim)) || oldSelf.source.startsWith('pvc://') || (has(oldSelf.cache) && has(oldSelf.cache.existingClaim)) || (has(self.cache) && has(self.cache.accessMode) ? self.cache.accessMode : 'ReadWriteOnce') == (has(oldSelf.cache) && has(oldSelf.cache.accessMode) ? oldSelf.cache.accessMode : 'ReadWriteOnce')",message="cache.accessMode cannot be changed in place: the access mode of a PersistentVolumeClaim is immutable; use a new application name, or an existingClaim",fieldPath=".cache.accessMode"
// +kubebuilder:validation:XValidation:rule="self.source.startsWith('pvc://') || (has(self.cache) && has(self.cache.existingClaim)) || oldSelf.source.startsWith('pvc://') || (has(oldSelf.cache) && has(oldSelf.cache.existingClaim)) || (has(self.cache) && has(self.cache.storageClassName) ? self.cache.storageClassName : '(default)') == (has(oldSelf.cache) && has(oldSelf.cache.storageClassName) ? oldSelf.cache.storageClassName : '(default)')",message="cache.storageClassName cannot be changed in place: the storage class of a PersistentVolumeClaim is immutable; use a new application name, or an existingClaim",fieldPath=".cache.storageClassName"
//
// +kubebuilder:validation:XValidation:rule="!self.source.startsWith('pvc://') || !has(self.cache)",message="a pvc:// source is read in place from its claim: remove cache",fieldPath=".cache"
// +kubebuilder:validation:XValidation:rule="!self.source.startsWith('pvc://') || (!has(self.include) && !has(self.exclude) && !has(self.tokenSecretRef))",message="include, exclude and tokenSecretRef apply to downloaded models, not to a pvc:// source"
// +kubebuilder:validation:XValidation:rule="!has(self.tokenSecretRef) || self.source.startsWith('hf://') || self.source.startsWith('https://')",message="tokenSecretRef is used for hf:// and https:// sources; s3:// sources take credentials from credentialsSecretRef",fieldPath=".tokenSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.credentialsSecretRef) || self.source.startsWith('s3://')",message="credentialsSecretRef is used for s3:// sources only",fieldPath=".credentialsSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.s3) || self.source.startsWith('s3://')",message="s3 is used for s3:// sources only",fieldPath=".s3"
// +kubebuilder:validation:XValidation:rule="!has(self.sha256) || self.source.startsWith('https://')",message="sha256 checks a single https:// file",fieldPath=".sha256"
// +kubebuilder:validation:XValidation:rule="!has(self.convert) || !self.source.startsWith('pvc://')",message="convert writes the GGUF file into the model cache: a pvc:// source is read in place; download it (hf://, https://, s3://) or convert it beforehand",fieldPath=".convert"
type ModelSpec struct {
	// source of the model files:
	// hf://<org>/<repo>[@<revision>] (a Hugging Face repository),
	// https://<host>/<path> (one file),
	// s3://<bucket>/<prefix> (an S3-compatible bucket), or
	// pvc://<claim>/<path> (files already on a PersistentVolumeClaim in the
	// resource's namespace, used in place without a download).
	// +required
	// +kubebuilder:validation:MinLength=6
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches('^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(@[^ @]+)?|https://[^ /]+/[^ ]*|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/[^ ]*)?|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^ ]*)?)$')",message="source must be hf://<org>/<repo>[@<revision>], https://<host>/<path>, s3://<bucket>[/<prefix>] or pvc://<claim>[/<path>]"
	Source string `json:"source"`

	// include are glob patterns of the files to download (for example
	// "*.Q4_K_M.gguf"); empty downloads every file.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Include []string `json:"include,omitempty"`

	// exclude are glob patterns of files not to download, applied after
	// include.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Exclude []string `json:"exclude,omitempty"`

	// hubEndpoint is the base URL of a Hugging Face-compatible hub or mirror
	// that hf:// sources are downloaded from instead of
	// https://huggingface.co, as HF_ENDPOINT sets it for the Hugging Face
	// tools; for example http://hf-mirror.models.svc:8080. The fetch pod
	// must reach it. Only used with hf:// sources.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^ ]+$`
	HubEndpoint string `json:"hubEndpoint,omitempty"`

	// tokenSecretRef is a Secret key holding the access token for a private
	// Hugging Face repository or an https:// source (sent as a bearer token).
	// +optional
	TokenSecretRef *SecretKeyRef `json:"tokenSecretRef,omitempty"`

	// credentialsSecretRef names a Secret with the keys AWS_ACCESS_KEY_ID
	// and AWS_SECRET_ACCESS_KEY for s3:// sources; without it the fetcher
	// uses the pod's cloud identity.
	// +optional
	CredentialsSecretRef *corev1.LocalObjectReference `json:"credentialsSecretRef,omitempty"`

	// s3 locates an S3-compatible store for s3:// sources.
	// +optional
	S3 *S3Spec `json:"s3,omitempty"`

	// sha256 is the expected SHA-256 digest (hex) of an https:// file; the
	// download fails on a mismatch.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256,omitempty"`

	// format of the model files. Defaults to the engine's native format:
	// gguf for llamacpp and ollama, dllama for dllama, safetensors for vllm.
	// A model already converted for distributed-llama has format dllama.
	// +optional
	Format ModelFormat `json:"format,omitempty"`

	// file is the model file the engine loads, relative to the model
	// directory (for gguf and dllama models). With convert it names the
	// converted GGUF file, by default model-<weightType>.gguf.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.contains('..')",message="file must be a relative path inside the model directory"
	File string `json:"file,omitempty"`

	// tokenizerFile is the distributed-llama tokenizer file (.t) relative to
	// the model directory.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.contains('..')",message="tokenizerFile must be a relative path inside the model directory"
	TokenizerFile string `json:"tokenizerFile,omitempty"`

	// convert asks for a conversion after the download: a Hugging Face
	// llama-family checkpoint (config.json, *.safetensors shards,
	// tokenizer.json and tokenizer_config.json with a byte-level BPE
	// tokenizer) becomes one GGUF file in the cache, which the llamacpp or
	// ollama engine then loads. An unsupported checkpoint fails the fetch
	// with a message naming what is missing (status
	// applications.<app>.model.message, ModelReady False).
	// +optional
	Convert *ModelConvert `json:"convert,omitempty"`

	// sizing checks, for the llamacpp and ollama engines, that the model
	// fits the engine container's memory limit before the engine starts:
	// after the fetch (and conversion) the model file's GGUF header gives
	// the weights and the memory for serving.contextLength tokens ×
	// serving.maxConcurrency sequences; if that plus the margin exceeds
	// runtime.resources.limits.memory, the fetch fails, ModelReady is False
	// with reason ModelTooLarge and the numbers, and engine pods wait in
	// their init container instead of starting into an out-of-memory kill.
	// The size is published in status.applications.<app>.model.size either
	// way.
	// +optional
	Sizing *ModelSizing `json:"sizing,omitempty"`

	// cache is the PersistentVolumeClaim the model is downloaded to once
	// and read from by every replica. Without it a 20Gi ReadWriteOnce claim
	// of the default storage class is used.
	// +optional
	Cache *CacheSpec `json:"cache,omitempty"`
}

// S3Spec locates an S3-compatible object store.
type S3Spec struct {
	// endpoint URL of an S3-compatible store, for example
	// http://minio.storage:9000; empty uses AWS S3.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^ ]+$`
	Endpoint string `json:"endpoint,omitempty"`

	// region of the bucket; empty asks the bucket.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Region string `json:"region,omitempty"`
}

// SecretKeyRef selects a key of a Secret in the resource's namespace.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key in the Secret.
	// +optional
	// +kubebuilder:default=token
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// CacheSpec is the model cache volume.
//
// +kubebuilder:validation:XValidation:rule="!has(self.existingClaim) || (!has(self.size) && !has(self.storageClassName) && !has(self.accessMode))",message="existingClaim uses a claim you manage: remove size, storageClassName and accessMode",fieldPath=".existingClaim"
type CacheSpec struct {
	// size of the claim; it must hold the model files. Defaults to 20Gi.
	// Once the claim exists it can only grow, and only when its storage
	// class allows volume expansion; otherwise the upgrade fails.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// storageClassName of the claim; empty uses the cluster's default class.
	// It cannot be changed once the claim exists.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName,omitempty"`

	// accessMode of the claim. ReadWriteOnce (the default) lets all pods on
	// one node share it; ReadWriteMany is needed when replicas or vLLM
	// workers run on several nodes. It cannot be changed once the claim
	// exists.
	// +optional
	// +kubebuilder:validation:Enum=ReadWriteOnce;ReadWriteMany;ReadWriteOncePod
	AccessMode corev1.PersistentVolumeAccessMode `json:"accessMode,omitempty"`

	// existingClaim is a claim in the resource's namespace to download the
	// model into instead of a claim created by the operator.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ExistingClaim string `json:"existingClaim,omitempty"`
}

// Engine is an inference engine.
// +kubebuilder:validation:Enum=llamacpp;dllama;vllm;ollama;simulator
type Engine string

// Inference engines.
const (
	// EngineLlamaCPP is llama.cpp's llama-server, with rpc-server workers.
	EngineLlamaCPP Engine = "llamacpp"
	// EngineDllama is distributed-llama: dllama-api root and dllama workers.
	EngineDllama Engine = "dllama"
	// EngineVLLM is vLLM, multi-node through a Ray head and Ray workers.
	EngineVLLM Engine = "vllm"
	// EngineOllama is Ollama, single node.
	EngineOllama Engine = "ollama"
	// EngineSimulator is orchestra-sim, a CPU-only engine that imitates an
	// OpenAI server for tests and demos.
	EngineSimulator Engine = "simulator"
)

// RuntimeSpec is the inference engine and where it runs.
type RuntimeSpec struct {
	// engine runs the model.
	// +optional
	// +kubebuilder:default=llamacpp
	Engine Engine `json:"engine,omitempty"`

	// image replaces the engine's default image.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Image string `json:"image,omitempty"`

	// imagePullPolicy of the engine containers.
	// +optional
	// +kubebuilder:default=IfNotPresent
	// +kubebuilder:validation:Enum=Always;IfNotPresent;Never
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// args are appended to the engine's command line on the root (for
	// example ["--flash-attn", "on"] for llama.cpp).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Args []string `json:"args,omitempty"`

	// env is added to every engine container.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=64
	Env []corev1.EnvVar `json:"env,omitempty"`

	// workers is the number of worker pods beside the root in each replica:
	// llama.cpp rpc-servers, distributed-llama workers (root plus workers a
	// power of two) or vLLM Ray workers.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=63
	Workers int32 `json:"workers,omitempty"`

	// resources of each engine container (root and workers), without GPUs:
	// use gpu for those. Defaults to requests of 1 CPU and 2Gi memory (for
	// the simulator 50m CPU and 64Mi memory, with a 256Mi memory limit).
	// +optional
	Resources *corev1.ResourceRequirements `json:"resources,omitempty"`

	// gpu requests NVIDIA GPUs for each engine pod.
	// +optional
	// +kubebuilder:default={}
	GPU GPUSpec `json:"gpu,omitempty"`

	// nodeSelector constrains the engine pods to nodes with these labels.
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// tolerations of the engine pods.
	// +optional
	// +listType=atomic
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`

	// affinity of the engine pods.
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
}

// GPUSpec requests NVIDIA GPUs.
//
// +kubebuilder:validation:XValidation:rule="!has(self.product) || self.count > 0",message="product needs count of at least 1",fieldPath=".count"
type GPUSpec struct {
	// count of nvidia.com/gpu per engine pod; 0 runs on CPU.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	Count int32 `json:"count,omitempty"`

	// product restricts the pods to nodes whose nvidia.com/gpu.product label
	// has this value (as set by GPU feature discovery), for example
	// NVIDIA-A100-SXM4-80GB.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	Product string `json:"product,omitempty"`
}

// ServingSpec is how the model is offered to clients.
type ServingSpec struct {
	// servedModelName is the model name clients send in the "model" field.
	// Defaults to the application name.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][-A-Za-z0-9_.:/]*$`
	ServedModelName string `json:"servedModelName,omitempty"`

	// maxConcurrency is how many requests one replica processes at once
	// (llama.cpp --parallel, vLLM --max-num-seqs, OLLAMA_NUM_PARALLEL); the
	// dispatcher sends no more than this.
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	MaxConcurrency int32 `json:"maxConcurrency,omitempty"`

	// contextLength is the context window in tokens; empty uses the
	// model's own.
	// +optional
	// +kubebuilder:validation:Minimum=128
	ContextLength int32 `json:"contextLength,omitempty"`

	// warmupPrompts are sent to each replica once it starts, before it is
	// reported ready, so that the first client does not pay for loading.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	WarmupPrompts []string `json:"warmupPrompts,omitempty"`

	// routing is how the dispatcher picks the replica of each request.
	// PrefixCache: the replica where the request costs least, the part
	// of its prompt that replica's engine would have to prefill (what was
	// recently sent there it most likely still holds in its prefix cache)
	// plus the wait behind the requests already in flight there; a
	// replica over 1.25 times the mean load (plus one) is left out. With
	// no prefix cached anywhere, that is the least loaded.
	// LeastLoaded: the replica with the fewest requests in flight.
	// +optional
	// +kubebuilder:default=PrefixCache
	// +kubebuilder:validation:Enum=PrefixCache;LeastLoaded
	Routing Routing `json:"routing,omitempty"`
}

// Routing is how the dispatcher picks a replica per request.
type Routing string

// Routings.
const (
	// RoutingPrefixCache routes by prompt prefix, within a load bound.
	RoutingPrefixCache Routing = "PrefixCache"
	// RoutingLeastLoaded routes to the replica with the fewest requests
	// in flight.
	RoutingLeastLoaded Routing = "LeastLoaded"
)

// ScalingSpec is how many copies of the topology run.
type ScalingSpec struct {
	// replicas of the whole topology (a root with its workers). 0 stops the
	// engines but keeps the model cache.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	Replicas int32 `json:"replicas,omitempty"`
}

// Phase summarises the state of the stack or of one application.
type Phase string

// Phases.
const (
	// PhasePending means nothing is running yet.
	PhasePending Phase = "Pending"
	// PhaseDownloading means the model is being fetched into the cache.
	PhaseDownloading Phase = "Downloading"
	// PhaseStarting means the model is cached and the engines are loading it.
	PhaseStarting Phase = "Starting"
	// PhaseReady means every replica serves.
	PhaseReady Phase = "Ready"
	// PhaseDegraded means some, not all, replicas serve.
	PhaseDegraded Phase = "Degraded"
	// PhaseStopped means the application is scaled to zero.
	PhaseStopped Phase = "Stopped"
	// PhaseFailed means the model could not be fetched or the release failed.
	PhaseFailed Phase = "Failed"
)

// Condition types set by the operator. The first five are the Helm engine's;
// the others are derived from the live objects.
const (
	ConditionInitialized    = "Initialized"
	ConditionDeployed       = "Deployed"
	ConditionReleaseFailed  = "ReleaseFailed"
	ConditionIrreconcilable = "Irreconcilable"
	ConditionPaused         = "Paused"
	// ConditionModelReady is True when every application's model is cached
	// and verified.
	ConditionModelReady = "ModelReady"
	// ConditionTopologyReady is True when every application has all its
	// replicas (root and workers) ready.
	ConditionTopologyReady = "TopologyReady"
	// ConditionGatewayReady is True when the gateway has ready endpoints and
	// the queue and dispatcher run.
	ConditionGatewayReady = "GatewayReady"
	// ConditionReady is True when clients can use every application through
	// the endpoint.
	ConditionReady = "Ready"
)

// Condition reasons set by the status plugin.
const (
	ReasonModelsCached     = "ModelsCached"
	ReasonModelDownloading = "ModelDownloading"
	ReasonModelFetchFailed = "ModelFetchFailed"
	// ReasonModelTooLarge: a model's memory estimate (plus the margin)
	// exceeds its engine's memory limit; the message names the numbers.
	ReasonModelTooLarge      = "ModelTooLarge"
	ReasonModelPending       = "ModelPending"
	ReasonTopologyAvailable  = "TopologyAvailable"
	ReasonTopologyStarting   = "TopologyStarting"
	ReasonTopologyScaledDown = "TopologyScaledDown"
	ReasonGatewayAvailable   = "GatewayAvailable"
	ReasonGatewayUnavailable = "GatewayUnavailable"
	ReasonQueueUnavailable   = "QueueUnavailable"
	ReasonAllReady           = "AllApplicationsServing"
	ReasonNotReady           = "NotReady"
)

// ModelOrchestraStatus is the observed state of the stack.
type ModelOrchestraStatus struct {
	// phase summarises the stack: Pending, Downloading, Starting, Ready,
	// Degraded or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// observedGeneration is the generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Initialized, Deployed, ReleaseFailed, Irreconcilable and
	// Paused (the Helm release) and ModelReady, TopologyReady, GatewayReady
	// and Ready (the serving stack).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// endpoint is the OpenAI-compatible base URL, for example
	// http://demo-gateway.default.svc:80/v1, or the Ingress/HTTPRoute URL.
	// +optional
	Endpoint string `json:"endpoint,omitempty"`

	// modelSize summarises the applications' model sizes, for kubectl get:
	// for example "chat: 1.1B Q8_0 1.1GiB, needs 1.4GiB".
	// +optional
	ModelSize string `json:"modelSize,omitempty"`

	// readyApplications is "<ready>/<total>", for kubectl get.
	// +optional
	ReadyApplications string `json:"readyApplications,omitempty"`

	// awakeApplications is "<awake>/<total>", for kubectl get: an
	// application with a lifecycle at zero pods or asleep is ready but not
	// awake.
	// +optional
	AwakeApplications string `json:"awakeApplications,omitempty"`

	// applications is the state of each application, by name.
	// +optional
	Applications map[string]ApplicationStatus `json:"applications,omitempty"`

	// deployedRelease is the Helm release currently deployed.
	// +optional
	DeployedRelease *DeployedRelease `json:"deployedRelease,omitempty"`
}

// ApplicationStatus is the observed state of one application.
type ApplicationStatus struct {
	// phase of the application: Pending, Downloading, Starting, Ready,
	// Degraded, Stopped, Idle (at zero pods by its lifecycle, wakes on the
	// next request), Asleep (its engines sleep in running pods, wake on the
	// next request), Waking or Failed.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// servedModelName is the model name clients send.
	// +optional
	ServedModelName string `json:"servedModelName,omitempty"`

	// model is the state of the model cache.
	// +optional
	Model ModelStatus `json:"model,omitempty"`

	// replicas is the desired number of topology replicas.
	// +optional
	Replicas int32 `json:"replicas"`

	// readyReplicas counts replicas whose root and workers are all ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`

	// workers is the desired number of worker pods over all replicas.
	// +optional
	Workers int32 `json:"workers,omitempty"`

	// readyWorkers counts ready worker pods.
	// +optional
	ReadyWorkers int32 `json:"readyWorkers,omitempty"`

	// message explains a phase other than Ready.
	// +optional
	Message string `json:"message,omitempty"`

	// lifecycle is the state of an application with spec lifecycle.
	// +optional
	Lifecycle *LifecycleStatus `json:"lifecycle,omitempty"`
}

// ModelStatus is the state of a model cache, as reported by the fetcher.
type ModelStatus struct {
	// phase of the download: Pending, Downloading, Verifying, Complete or
	// Failed.
	// +optional
	Phase string `json:"phase,omitempty"`

	// bytes downloaded so far.
	// +optional
	Bytes int64 `json:"bytes"`

	// bytesTotal is the size of the model, when known.
	// +optional
	BytesTotal int64 `json:"bytesTotal,omitempty"`

	// files downloaded so far.
	// +optional
	Files int32 `json:"files"`

	// filesTotal is the number of files to download, when known.
	// +optional
	FilesTotal int32 `json:"filesTotal,omitempty"`

	// progressPercent of the download, 0 to 100.
	// +optional
	ProgressPercent int32 `json:"progressPercent"`

	// etaSeconds is the estimated time left for the download.
	// +optional
	ETASeconds int64 `json:"etaSeconds,omitempty"`

	// verified is true once every file's checksum matched.
	// +optional
	Verified bool `json:"verified"`

	// message from the fetcher, for example the reason of a failure.
	// +optional
	Message string `json:"message,omitempty"`

	// size of a GGUF model, read from its header after the fetch (and
	// conversion), with the memory it needs.
	// +optional
	Size *ModelSize `json:"size,omitempty"`
}

// DeployedRelease identifies the deployed Helm release. The engine writes it.
type DeployedRelease struct {
	// name of the release.
	Name string `json:"name,omitempty"`
	// revision of the release.
	Revision int `json:"revision,omitempty"`
	// chart name.
	Chart string `json:"chart,omitempty"`
	// version of the chart.
	Version string `json:"version,omitempty"`
	// digest of the rendered manifest.
	Digest string `json:"digest,omitempty"`
}
