package v1alpha1

import corev1 "k8s.io/api/core/v1"

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

	// runAsUser is the user id the engine containers run as, and, in a seat
	// group, the sidecar beside each engine (the sidecar signals the
	// engine's processes, which the kernel allows only to the same user).
	// Empty runs the chart's own Ollama and simulator images as their user
	// 65532, and any other image (vLLM, llama.cpp and distributed-llama
	// upstream, which run as root, or a replaced image) as the user its
	// image names. Set it when the image runs as another user, for example
	// a vLLM or llama.cpp image built to run as non-root.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	RunAsUser *int64 `json:"runAsUser,omitempty"`

	// runAsGroup is the primary group id of the engine containers (and
	// their seats in a seat group). Defaults to runAsUser when that is set,
	// to 65532 for the chart's own images, and, for an engine that reads or
	// writes the node agent's tiers, to the agent's copy group (which the
	// pod then also has as a supplementary group).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=2147483647
	RunAsGroup *int64 `json:"runAsGroup,omitempty"`

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
