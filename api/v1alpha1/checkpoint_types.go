package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CheckpointPolicy is a reusable way of putting idle engines to sleep and
// keeping their weights in tiers: when to sleep (triggers), where the
// weights may rest (tiers) and how fast they must come back (slo).
// Applications reference it by name from spec.applications.<app>.lifecycle
// .checkpointPolicy; the fields an application sets inline override the
// policy's, field by field. It has no status: the API server checks it
// completely when it is written, and whether a ModelOrchestra found the
// policy it references is that resource's CheckpointPolicyResolved
// condition.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:path=checkpointpolicies,singular=checkpointpolicy,shortName=cpp,categories=modelorchestra
// +kubebuilder:printcolumn:name="Idle",type=integer,JSONPath=`.spec.triggers.idleSeconds`,description="Seconds without requests before the engine sleeps"
// +kubebuilder:printcolumn:name="Hot",type=string,JSONPath=`.spec.tiers.hot`
// +kubebuilder:printcolumn:name="Warm",type=string,JSONPath=`.spec.tiers.warm`
// +kubebuilder:printcolumn:name="Cold",type=string,JSONPath=`.spec.tiers.cold`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CheckpointPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the policy.
	// +required
	Spec CheckpointPolicySpec `json:"spec"`
}

// CheckpointPolicyList is a list of CheckpointPolicy.
//
// +kubebuilder:object:root=true
type CheckpointPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CheckpointPolicy `json:"items"`
}

// CheckpointPolicySpec says when engines sleep, where their weights rest
// and how fast they must resume. Every field is optional; the defaults are
// documented on each field and applied by the operator, so that an
// application's inline field can tell "unset" from "set to the default".
type CheckpointPolicySpec struct {
	// triggers say when an engine is put to sleep and demoted.
	// +optional
	Triggers CheckpointTriggers `json:"triggers,omitempty"`

	// tiers say where the weights of a sleeping engine may rest.
	// +optional
	Tiers CheckpointTiers `json:"tiers,omitempty"`

	// slo is how fast a sleeping engine must resume, per tier. The operator
	// compares it with the expected resume time (the bytes to restore over
	// the tier's measured read bandwidth) and sets the ResumeSLOAtRisk
	// condition when the expected time exceeds it.
	// +optional
	SLO ResumeSLO `json:"slo,omitempty"`
}

// CheckpointTriggers say when an engine is put to sleep and demoted.
type CheckpointTriggers struct {
	// idleSeconds without a request (none queued, none in flight) before
	// the engine is put to sleep. The pod keeps running; the weights leave
	// the accelerator for the hot tier (sleep level 1) or are dropped
	// (level 2). Unset: the engine never sleeps, and an application with
	// minReplicas 0 goes straight to zero after zeroAfter.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=604800
	IdleSeconds *int32 `json:"idleSeconds,omitempty"`

	// parkSeconds asleep before the application is parked: an engine's
	// level-1 offload is demoted to the warm tier (node-local disk),
	// freeing the node's RAM, and with minReplicas 0 the pods are scaled
	// away while the node agents keep their copies (the lifecycle's
	// parkAfter, which overrides it). Unset: never parked; the weights
	// stay hot until the node agent evicts them for a copy of higher
	// priority or more recent use.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2592000
	ParkSeconds *int32 `json:"parkSeconds,omitempty"`

	// intervalSeconds between verifications of the tier copies: the node
	// agent re-hashes each copy it keeps at this period (the shortest of
	// the release's sleeping applications) and drops a copy that does not
	// match (the next wake then comes from the tier below); the
	// application's ModelCheckpoint then has Verified False, reason
	// CopyDropped. Default 900.
	// +optional
	// +kubebuilder:validation:Minimum=60
	// +kubebuilder:validation:Maximum=604800
	IntervalSeconds *int32 `json:"intervalSeconds,omitempty"`

	// preemption lets the lifecycle put this application's engine to sleep
	// before idleSeconds, to free an accelerator seat for another
	// application of its seat group (see lifecycle.seat). Never while it
	// has requests in flight. Default true. A seat group's leader frees
	// seats whatever it says; an application without a seat is never
	// preempted. Either mismatch (true without lifecycle.seat, false with
	// it) sets the CheckpointFieldsSupported condition False naming it.
	// +optional
	Preemption *bool `json:"preemption,omitempty"`
}

// CheckpointTiers say where the weights of a sleeping engine may rest.
type CheckpointTiers struct {
	// hot is node RAM (a tmpfs owned by the node agent): RAM, or None to
	// skip it. Default RAM. None is honored with sleepLevel 2 (the weights
	// are dropped, never offloaded to RAM); with sleepLevel 1, whose sleep
	// offloads them to RAM, it is not, and the CheckpointFieldsSupported
	// condition is False naming it.
	// +optional
	// +kubebuilder:validation:Enum=RAM;None
	Hot HotTier `json:"hot,omitempty"`

	// warm is node-local disk owned by the node agent: Disk, or None to
	// skip it. Default Disk.
	// +optional
	// +kubebuilder:validation:Enum=Disk;None
	Warm WarmTier `json:"warm,omitempty"`

	// cold is where the node agent reads the weights when no node copy
	// exists, to place a warm copy ahead of a predicted wake or when a
	// demotion cannot copy the hot one: ModelCache (the application's
	// model-cache claim, filled by the fetch Job, when every node can
	// mount it) or S3 (the object of the model's s3:// source that the
	// engine loads, read with the model's credentialsSecretRef and s3
	// endpoint). Default ModelCache. Either way the copy is verified
	// against the weights' digest. S3 needs an s3:// source, the
	// simulator with --weights-file and a credentialsSecretRef; otherwise
	// the CheckpointFieldsSupported condition is False saying which is
	// missing. An engine's own cold wake still reads its model cache.
	// +optional
	// +kubebuilder:validation:Enum=ModelCache;S3
	Cold ColdTier `json:"cold,omitempty"`

	// processSnapshots turns on process snapshots on the nodes of the
	// application's engines: the node agent may dump a whole engine process
	// with its weights (criu) and restore it, a tier for engines whose
	// state is more than their weights. Default false. Off, nothing
	// privileged is rendered. On, the node agent is rendered with what criu
	// needs: root with the CHECKPOINT_RESTORE, SYS_ADMIN and SYS_PTRACE
	// capabilities, the host's process namespace and a snapshot directory
	// on the node. The ModelOrchestra's ProcessSnapshotsSupported condition
	// then says whether the nodes can: it is False, naming the node and
	// the reason, while a node agent reports that `criu check` fails or that
	// the container runtime lacks the kubelet checkpoint API (containerd
	// before 2.0). A snapshot is never restored by re-creating a container
	// (restore-via-create, deprecated in containerd).
	// +optional
	ProcessSnapshots *bool `json:"processSnapshots,omitempty"`
}

// HotTier is the RAM tier's setting.
type HotTier string

// WarmTier is the node-disk tier's setting.
type WarmTier string

// ColdTier is the source of weights without a node copy.
type ColdTier string

// Tier settings.
const (
	HotTierRAM         HotTier  = "RAM"
	HotTierNone        HotTier  = "None"
	WarmTierDisk       WarmTier = "Disk"
	WarmTierNone       WarmTier = "None"
	ColdTierModelCache ColdTier = "ModelCache"
	ColdTierS3         ColdTier = "S3"
)

// ResumeSLO is how fast a sleeping engine must resume, per tier it resumes
// from, in seconds from the wake decision to an engine that serves.
type ResumeSLO struct {
	// resumeRamSeconds bounds a wake from the hot tier. Default 1.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	ResumeRAMSeconds *int32 `json:"resumeRamSeconds,omitempty"`

	// resumeNvmeSeconds bounds a wake from the warm tier (node-local disk).
	// Default 5.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	ResumeNVMeSeconds *int32 `json:"resumeNvmeSeconds,omitempty"`
}

// ModelCheckpoint records where the weights of one application rest: on
// which node, in which tier, how many bytes, their digest, when they were
// last verified and how fast the tier reads. The operator's chart creates
// one per application that sleeps, named <orchestra>-<application> and
// owned by the ModelOrchestra (it goes with it); the lifecycle leader
// writes its status from the node agents' reports. Users do not create it.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=modelcheckpoints,singular=modelcheckpoint,shortName=mcp,categories=modelorchestra
// +kubebuilder:printcolumn:name="Orchestra",type=string,JSONPath=`.spec.orchestra`
// +kubebuilder:printcolumn:name="App",type=string,JSONPath=`.spec.application`
// +kubebuilder:printcolumn:name="Resident",type=string,JSONPath=`.status.residentTier`,description="The fastest tier holding a verified copy"
// +kubebuilder:printcolumn:name="Resume",type=string,JSONPath=`.status.expectedResumeSeconds`,description="Expected seconds to resume from the resident tier"
// +kubebuilder:printcolumn:name="Bytes",type=integer,JSONPath=`.status.bytes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ModelCheckpoint struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec names the application.
	// +required
	Spec ModelCheckpointSpec `json:"spec"`

	// status is written by the lifecycle leader.
	// +optional
	Status ModelCheckpointStatus `json:"status,omitempty"`
}

// ModelCheckpointList is a list of ModelCheckpoint.
//
// +kubebuilder:object:root=true
type ModelCheckpointList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelCheckpoint `json:"items"`
}

// ModelCheckpointSpec names the application whose weights are recorded.
type ModelCheckpointSpec struct {
	// orchestra is the ModelOrchestra in the same namespace.
	// +required
	// +kubebuilder:validation:MaxLength=40
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="orchestra is immutable"
	Orchestra string `json:"orchestra"`

	// application is the application's name in the orchestra.
	// +required
	// +kubebuilder:validation:MaxLength=24
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="application is immutable"
	Application string `json:"application"`
}

// Tier is a place the weights of an engine can be.
// +kubebuilder:validation:Enum=Accelerator;Hot;Warm;Cold
type Tier string

// Tiers, fastest first.
const (
	// TierAccelerator: the weights are loaded in the engine (awake).
	TierAccelerator Tier = "Accelerator"
	// TierHot: node RAM.
	TierHot Tier = "Hot"
	// TierWarm: node-local disk.
	TierWarm Tier = "Warm"
	// TierCold: the model cache claim or S3.
	TierCold Tier = "Cold"
)

// ModelCheckpointStatus is where the weights rest.
type ModelCheckpointStatus struct {
	// residentTier is the fastest tier holding a verified copy.
	// +optional
	ResidentTier Tier `json:"residentTier,omitempty"`

	// expectedResumeSeconds is the expected time to resume from
	// residentTier: the bytes over the tier's measured read bandwidth, plus
	// the engine's own start-up share, as a decimal string ("0.42").
	// +optional
	ExpectedResumeSeconds string `json:"expectedResumeSeconds,omitempty"`

	// bytes of the weights.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`

	// digest of the weights (xxh3c:<16 hex>: XXH3 over the XXH3 digests of
	// its 1 MiB chunks), recorded when the engine
	// first loaded them; every copy and every restore is checked against
	// it.
	// +optional
	Digest string `json:"digest,omitempty"`

	// placements are the copies, one per node and tier.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=64
	Placements []Placement `json:"placements,omitempty"`

	// nodes are the nodes of the application's engines, as their node
	// agents report them: what each can do for process snapshots.
	// +optional
	// +listType=map
	// +listMapKey=node
	// +kubebuilder:validation:MaxItems=64
	Nodes []CheckpointNode `json:"nodes,omitempty"`

	// conditions: Verified (every placement matched its digest at its last
	// check).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CheckpointNode is what one node can do for checkpoints, as its node agent
// reports it.
type CheckpointNode struct {
	// node name.
	// +required
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`

	// containerRuntimeVersion is the node's container runtime
	// (status.nodeInfo.containerRuntimeVersion, for example
	// containerd://1.7.24), empty when the agent could not learn it.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	ContainerRuntimeVersion string `json:"containerRuntimeVersion,omitempty"`

	// processSnapshots is true when both `criu check` and the container
	// runtime's checkpoint support pass on the node.
	// +optional
	ProcessSnapshots bool `json:"processSnapshots,omitempty"`

	// processSnapshotsReason says why the node cannot take process
	// snapshots.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	ProcessSnapshotsReason string `json:"processSnapshotsReason,omitempty"`
}

// Placement is one copy of the weights.
type Placement struct {
	// node holding the copy (empty for the cold tier).
	// +optional
	Node string `json:"node,omitempty"`

	// tier of the copy.
	// +required
	Tier Tier `json:"tier"`

	// bytes of the copy.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`

	// digest of the copy, as last verified.
	// +optional
	Digest string `json:"digest,omitempty"`

	// verifiedTime is when the copy last matched its digest.
	// +optional
	VerifiedTime *metav1.Time `json:"verifiedTime,omitempty"`

	// readBytesPerSecond is the tier's read bandwidth measured on the node.
	// +optional
	ReadBytesPerSecond int64 `json:"readBytesPerSecond,omitempty"`

	// lastUsedTime is when the copy last served a wake or was written.
	// +optional
	LastUsedTime *metav1.Time `json:"lastUsedTime,omitempty"`
}

// Condition types and reasons of checkpoints.
const (
	// ConditionResumeSLOAtRisk is True on a ModelOrchestra when an
	// application's expected resume time exceeds its resume SLO; the
	// message names the application, the tier and both numbers.
	ConditionResumeSLOAtRisk = "ResumeSLOAtRisk"
	// ConditionCheckpointPolicyResolved is False when an application
	// references a CheckpointPolicy that does not exist; the message names
	// it.
	ConditionCheckpointPolicyResolved = "CheckpointPolicyResolved"
	// ConditionCheckpointFieldsSupported is False while a sleeping
	// application sets a checkpoint field the operator accepts but does
	// not act on (tiers.hot None with sleepLevel 1, tiers.cold S3 where
	// the node agent cannot read the model's object, triggers.preemption
	// true); the message
	// names each application and field. True once none does.
	ConditionCheckpointFieldsSupported = "CheckpointFieldsSupported"

	// ConditionProcessSnapshotsSupported is set on a ModelOrchestra while an
	// application has tiers.processSnapshots: True when every node agent of
	// its engines reports that it can take process snapshots, False naming
	// each node that cannot and why (criu check, the container runtime and
	// its version), Unknown until the node agents have reported.
	ConditionProcessSnapshotsSupported = "ProcessSnapshotsSupported"

	ReasonResumeWithinSLO       = "ResumeWithinSLO"
	ReasonResumeSlowerThanSLO   = "ResumeSlowerThanSLO"
	ReasonPoliciesResolved      = "PoliciesResolved"
	ReasonPolicyNotFound        = "CheckpointPolicyNotFound"
	ReasonCheckpointUnsupported = "CheckpointUnsupported"
	ReasonCheckpointSupported   = "CheckpointSupported"

	ReasonProcessSnapshotsSupported   = "ProcessSnapshotsSupported"
	ReasonProcessSnapshotsUnsupported = "ProcessSnapshotsUnsupported"
	ReasonAwaitingNodeReport          = "AwaitingNodeReport"
	ReasonProcessSnapshotsOff         = "ProcessSnapshotsOff"
)
