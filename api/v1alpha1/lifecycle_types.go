package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LifecycleSpec lets an application scale with its demand: from zero pods
// when it has been idle for zeroAfter, back to one on the first request
// (which waits in the queue meanwhile, never in a proxy), and between one
// and maxReplicas with its backlog. Exactly one component decides: the
// dispatcher's leader writes the replica count of the application's root
// and worker StatefulSets through their scale subresource; the chart then
// renders no replica count for them, so upgrades and drift repair never
// reset it. Without lifecycle, scaling.replicas is the fixed size.
//
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="lifecycle.minReplicas must not exceed lifecycle.maxReplicas",fieldPath=".minReplicas"
// +kubebuilder:validation:XValidation:rule="self.scaler != 'KEDA' || self.maxReplicas > 1",message="lifecycle.scaler KEDA scales from 1 to maxReplicas: set maxReplicas above 1, or use the Builtin scaler",fieldPath=".scaler"
// +kubebuilder:validation:XValidation:rule="!has(self.seat) || self.maxReplicas <= 1",message="lifecycle.maxReplicas must be 1 for an application with lifecycle.seat: its seat group's pods are counted by spec.seatGroups.<group>.replicas",fieldPath=".maxReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.sleepAfter) || self.minReplicas > 0 || duration(self.sleepAfter) < duration(has(self.zeroAfter) ? self.zeroAfter : '15m')",message="lifecycle.sleepAfter must be shorter than zeroAfter: engines sleep first and go to zero pods later",fieldPath=".sleepAfter"
type LifecycleSpec struct {
	// minReplicas is the fewest topology replicas kept running. 0 lets the
	// application go to zero pods (root and workers) after zeroAfter
	// without requests; the next request wakes it.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=32
	MinReplicas int32 `json:"minReplicas"`

	// maxReplicas is the most topology replicas the backlog may scale the
	// application to.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=32
	MaxReplicas int32 `json:"maxReplicas,omitempty"`

	// zeroAfter is how long the application must be idle (no request
	// queued, none in flight, none arriving) before it goes to zero pods.
	// Only used with minReplicas 0. It also paces scaling down from N to
	// fewer replicas (the backlog must have stayed lower for
	// min(zeroAfter, 1m)).
	// +optional
	// +kubebuilder:default="15m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="lifecycle.zeroAfter must be at least 1s"
	ZeroAfter metav1.Duration `json:"zeroAfter,omitempty"`

	// targetQueuePerReplica is the number of requests (queued plus in
	// flight) one replica should carry: the Builtin scaler runs
	// ceil(requests / targetQueuePerReplica) replicas, between
	// max(minReplicas, 1) and maxReplicas, while the application is awake.
	// Defaults to serving.maxConcurrency: scale out as soon as requests
	// queue behind a full replica.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100000
	TargetQueuePerReplica int32 `json:"targetQueuePerReplica,omitempty"`

	// maxWait is how long a request may wait for the application to wake.
	// Past it the gateway answers 503 with the code model_waking_timeout
	// and a Retry-After header (a streamed request that already received
	// keep-alives gets the same error as an SSE event), and the request is
	// removed from the queue. At most 10m, the gateway's bound on any wait
	// in the queue.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('10m')",message="lifecycle.maxWait must be between 1s and 10m (the gateway's maxQueueWait)"
	MaxWait metav1.Duration `json:"maxWait,omitempty"`

	// scaler decides between 1 and maxReplicas replicas: Builtin (the
	// dispatcher's leader, from the backlog) or KEDA (the chart renders a
	// KEDA ScaledObject whose NATS JetStream trigger reads the
	// application's consumer; KEDA must be installed). Waking from zero and
	// going to zero stay with the dispatcher either way, because the
	// durable hand-off through the queue is what makes them lossless.
	// +optional
	// +kubebuilder:default=Builtin
	// +kubebuilder:validation:Enum=Builtin;KEDA
	Scaler LifecycleScaler `json:"scaler,omitempty"`

	// sleepAfter is how long the application must be idle before its
	// engines are put to sleep: the pods keep running and leave the
	// Service's endpoints, the weights move out of the accelerator (to the
	// hot tier at sleep level 1, dropped at level 2), and the next request
	// wakes them in seconds instead of a pod start. It must be shorter
	// than zeroAfter when minReplicas is 0 (sleep first, then zero).
	// Overrides the policy's triggers.idleSeconds. Unset, with no policy:
	// the engines never sleep.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="lifecycle.sleepAfter must be at least 1s"
	SleepAfter *metav1.Duration `json:"sleepAfter,omitempty"`

	// sleepLevel is how the engine sleeps: 1 offloads the weights to the
	// hot tier (fast wake, uses node RAM), 2 drops them (wake reloads them
	// from the warm or cold tier). Default 1. The vLLM, Ollama, llama.cpp
	// and simulator engines sleep; distributed-llama cannot.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=2
	SleepLevel int32 `json:"sleepLevel,omitempty"`

	// parkAfter is how long the engines stay asleep before the
	// application is parked. Parking first moves an engine's own level-1
	// offload out of the hot tier into the node agent's warm tier
	// (node-local disk), verified, freeing the node's RAM; then, with
	// minReplicas 0, it scales the application's pods away, freeing their
	// accelerators, while the node agents keep their copies of the
	// weights: the next request is a wake from zero, and its root pods
	// prefer the nodes holding a hot or warm copy. With minReplicas above
	// 0 the pods stay (the demotion only). Counted from the sleep; unset,
	// never. Overrides the policy's triggers.parkSeconds.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="lifecycle.parkAfter must be at least 1s"
	ParkAfter *metav1.Duration `json:"parkAfter,omitempty"`

	// checkpointPolicy names a CheckpointPolicy in the resource's
	// namespace. The fields set here (sleepAfter, parkAfter, tiers,
	// resumeSLO) override the policy's. A policy that does not exist sets
	// the CheckpointPolicyResolved condition to False, naming it; the
	// application then runs with its inline fields only.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	CheckpointPolicy string `json:"checkpointPolicy,omitempty"`

	// tiers override the policy's tiers, field by field.
	// +optional
	Tiers *CheckpointTiers `json:"tiers,omitempty"`

	// resumeSLO overrides the policy's slo, field by field.
	// +optional
	ResumeSLO *ResumeSLO `json:"resumeSLO,omitempty"`

	// seat makes the application share an accelerator seat with the other
	// applications of the same seat group (spec.seatGroups): one pod per
	// group and replica runs one engine per application, and at most the
	// group's activeSeats of them are awake at a time.
	// +optional
	Seat *SeatSpec `json:"seat,omitempty"`
}

// SeatSpec is an application's membership in a seat group.
type SeatSpec struct {
	// group is the name of a seat group in spec.seatGroups.
	// +required
	// +kubebuilder:validation:MaxLength=24
	Group string `json:"group"`

	// priority orders who keeps a seat: when the seat is full, the awake
	// application with the lowest (priority, last use) that has nothing in
	// flight and has been resident for minResidency is put to sleep.
	// Default 0.
	// +optional
	// +kubebuilder:validation:Minimum=-1000
	// +kubebuilder:validation:Maximum=1000
	Priority int32 `json:"priority,omitempty"`

	// minResidency is how long a woken application keeps its seat before
	// it may be swapped out for another (against thrashing). Default 30s.
	// +optional
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+$`
	MinResidency *metav1.Duration `json:"minResidency,omitempty"`
}

// SeatGroupSpec is an accelerator seat shared by several applications.
type SeatGroupSpec struct {
	// activeSeats is how many of the group's applications may be awake at
	// once. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16
	ActiveSeats int32 `json:"activeSeats,omitempty"`

	// replicas is how many pods run the group, each with one engine per
	// application and its own activeSeats seats. An application may be
	// awake in several pods; requests for it go only to the pods where it
	// is awake. The count is fixed: the lifecycle does not scale a seat
	// group with its backlog. Default 1.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	Replicas int32 `json:"replicas,omitempty"`
	// deviceMemory is the memory of the accelerator the group's engines
	// share, for example 80Gi for an 80 GB GPU. Simulator engines get it
	// as one device pool per group pod, shared by their containers: an
	// engine whose weights do not fit while the others hold the memory
	// fails to load or wake with "device memory exhausted", and one that
	// finds the pool full at start starts asleep. Unset, the pool has no
	// fixed size. It must be more than 0 (the chart refuses it otherwise;
	// the API server cannot afford a rule on a quantity in this map). Not
	// applied to GPU engines, which see the device's own memory.
	// +optional
	DeviceMemory *resource.Quantity `json:"deviceMemory,omitempty"`
}

// LifecycleScaler decides the replica count between 1 and maxReplicas.
type LifecycleScaler string

// Scalers.
const (
	// ScalerBuiltin is the dispatcher's own backlog scaler.
	ScalerBuiltin LifecycleScaler = "Builtin"
	// ScalerKEDA is a KEDA ScaledObject rendered by the chart.
	ScalerKEDA LifecycleScaler = "KEDA"
)

// LifecycleState is where an application stands in its lifecycle. Clients
// never need to tell the states apart: every state but Awake means
// "requests wait in the queue".
type LifecycleState string

// Lifecycle states.
const (
	// LifecycleAwake means the application has ready replicas and serves.
	LifecycleAwake LifecycleState = "Awake"
	// LifecycleWaking means a request arrived while it had no pods: its
	// pods are starting, and requests wait in the queue.
	LifecycleWaking LifecycleState = "Waking"
	// LifecycleDraining means it is about to go to zero: the queue holds
	// new requests back until nothing is in flight; a request that
	// arrives meanwhile cancels the drain.
	LifecycleDraining LifecycleState = "Draining"
	// LifecycleZero means it runs no pods; the next request wakes it.
	LifecycleZero LifecycleState = "Zero"
	// LifecycleAsleep means its pods run but its engines sleep (weights
	// in the tier named by residentTier); the next request wakes them.
	LifecycleAsleep LifecycleState = "Asleep"
)

// Phases of an application with a lifecycle.
const (
	// PhaseIdle means the application runs no pods and wakes on the next
	// request: it is ready to serve, only slower for the first request.
	PhaseIdle Phase = "Idle"
	// PhaseWaking means its pods are starting because requests arrived.
	PhaseWaking Phase = "Waking"
	// PhaseAsleep means its engines sleep in running pods and wake on the
	// next request, from the tier in status.applications.<app>.lifecycle
	// .residentTier.
	PhaseAsleep Phase = "Asleep"
)

// Condition reasons of lifecycle applications.
const (
	// ReasonWakeFailing means pods of a waking application cannot start
	// (image pull, scheduling, crash loop); the message names the pod.
	ReasonWakeFailing = "WakeFailing"
)

// AnnotationLifecycleStatus is the annotation on an application's root
// StatefulSet holding its LifecycleStatus as JSON, written by the
// lifecycle leader; the operator reports it in
// status.applications.<app>.lifecycle.
const AnnotationLifecycleStatus = "modelorchestra.io/lifecycle"

// LifecycleStatusAnnotation is the annotation holding the LifecycleStatus
// of app: AnnotationLifecycleStatus on its own root StatefulSet, or
// AnnotationLifecycleStatus + "." + app on its seat group's StatefulSet,
// which the group's applications share (inGroup).
func LifecycleStatusAnnotation(app string, inGroup bool) string {
	if inGroup {
		return AnnotationLifecycleStatus + "." + app
	}
	return AnnotationLifecycleStatus
}

// LifecycleStatus is the lifecycle of one application, as reported by the
// dispatcher's leader.
type LifecycleStatus struct {
	// state is Awake, Waking, Draining, Zero or Asleep.
	// +optional
	State LifecycleState `json:"state,omitempty"`

	// since is when the application entered state.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// lastActiveTime is the last time a request was queued or in flight
	// (written at every transition, and at most once a minute while
	// awake).
	// +optional
	LastActiveTime *metav1.Time `json:"lastActiveTime,omitempty"`

	// replicas is the replica count the lifecycle last set.
	// +optional
	Replicas int32 `json:"replicas"`

	// wakes counts the wakes from zero since the dispatcher's leader
	// started.
	// +optional
	Wakes int64 `json:"wakes,omitempty"`

	// lastWake describes the latest wake from zero.
	// +optional
	LastWake *WakeStatus `json:"lastWake,omitempty"`

	// message explains a wake that does not progress, for example a pod
	// that cannot pull its image or be scheduled.
	// +optional
	Message string `json:"message,omitempty"`

	// residentTier is where the weights are: Accelerator while awake, Hot,
	// Warm or Cold while asleep or at zero.
	// +optional
	ResidentTier Tier `json:"residentTier,omitempty"`

	// expectedResumeSeconds is the expected time to wake from
	// residentTier, as a decimal string (the seed's Expected-Resume-Sec).
	// +optional
	ExpectedResumeSeconds string `json:"expectedResumeSeconds,omitempty"`

	// sleeps counts the engine sleeps since the dispatcher's leader
	// started.
	// +optional
	Sleeps int64 `json:"sleeps,omitempty"`

	// seat is the application's standing in its seat group.
	// +optional
	Seat *SeatStatus `json:"seat,omitempty"`

	// parked is set while the application is parked (state Zero after
	// parkAfter asleep): where the node agents keep its weights.
	// +optional
	Parked *ParkedStatus `json:"parked,omitempty"`
}

// SeatStatus is an application's standing in its seat group.
type SeatStatus struct {
	// holding is true while the application holds one of the group's
	// active seats.
	// +optional
	Holding bool `json:"holding,omitempty"`

	// pods are the group's pods where the application holds a seat (awake,
	// waking or draining), in name order; a group of several replicas may
	// hold it in several.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Pods []string `json:"pods,omitempty"`

	// swapsIn counts the times the application was swapped in.
	// +optional
	SwapsIn int64 `json:"swapsIn,omitempty"`

	// lastSwapSeconds is the duration of its last swap in, as a decimal
	// string.
	// +optional
	LastSwapSeconds string `json:"lastSwapSeconds,omitempty"`

	// waitingSeconds is how long its oldest request has waited for a seat,
	// as a decimal string; empty when none waits.
	// +optional
	WaitingSeconds string `json:"waitingSeconds,omitempty"`
}

// WakeStatus is one wake from zero.
type WakeStatus struct {
	// startTime is when the first request for the sleeping application
	// was seen.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`

	// trigger is what started it: request (a request arrived) or backlog
	// (requests were queued when the leader took over).
	// +optional
	Trigger string `json:"trigger,omitempty"`

	// seconds from the first request to a ready root; empty while waking.
	// +optional
	Seconds string `json:"seconds,omitempty"`

	// requestsWaiting is how many requests were queued when the root
	// became ready.
	// +optional
	RequestsWaiting int64 `json:"requestsWaiting,omitempty"`

	// fromTier is where the weights came from: Hot, Warm or Cold (a pod
	// start from the model cache).
	// +optional
	FromTier Tier `json:"fromTier,omitempty"`

	// bytes restored and verified by the wake.
	// +optional
	Bytes int64 `json:"bytes,omitempty"`

	// bytesPerSecond is bytes over the restore's duration.
	// +optional
	BytesPerSecond int64 `json:"bytesPerSecond,omitempty"`

	// firstTokenSeconds is from the first request to its first token, as a
	// decimal string.
	// +optional
	FirstTokenSeconds string `json:"firstTokenSeconds,omitempty"`
}
