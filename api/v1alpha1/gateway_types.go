package v1alpha1

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

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

	// directLane lets the gateway send chat and legacy completions straight
	// to a ready engine, on a slot its dispatcher lent it (a lease), while
	// the application serves: one pod, the engine, on the first token's
	// path. Requests beyond the lent slot, requests while the application
	// sleeps, wakes or is at zero, the Responses, embeddings and Batch
	// APIs, and applications whose prefix-aware routing chooses among
	// several roots go through the queue. A request on the direct lane is
	// not durable (it lives in the gateway; an engine failure before the
	// answer starts sends it through the queue). Default: true
	// (DefaultDirectLane); false sends every request through the queue.
	// +optional
	DirectLane *bool `json:"directLane,omitempty"`
}

// DefaultDirectLane is spec.gateway.directLane when it is not set. It is
// declared here only: the operator's translator uses DirectLaneEnabled.
const DefaultDirectLane = true

// DirectLaneEnabled reports whether the gateway's direct lane is on.
func (g GatewaySpec) DirectLaneEnabled() bool {
	if g.DirectLane == nil {
		return DefaultDirectLane
	}
	return *g.DirectLane
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
