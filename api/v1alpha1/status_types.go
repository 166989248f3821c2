package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
