package v1alpha1

import "time"

// The defaults of sleeping engines that more than one binary applies have
// their one owner here; internal/orchestra.EffectiveSleep resolves the
// resource's fields with them, and the binaries receive resolved values
// (their own defaults, for a configuration that names none, are these).
const (
	// DefaultSleepLevel is lifecycle.sleepLevel's default: the engine's
	// light sleep.
	DefaultSleepLevel int32 = 1
	// DefaultSeatMinResidency is lifecycle.seat.minResidency's default: how
	// long an application keeps a seat once woken before another may take
	// it.
	DefaultSeatMinResidency = 30 * time.Second
	// DefaultActiveSeats is spec.seatGroups.<group>.activeSeats' default:
	// one application of the group awake at a time in each pod.
	DefaultActiveSeats int32 = 1
	// DefaultSeatGroupReplicas is spec.seatGroups.<group>.replicas'
	// default: one pod.
	DefaultSeatGroupReplicas int32 = 1
	// DefaultVerifyInterval is triggers.intervalSeconds' default: the
	// period at which the node agent re-hashes the copies it keeps.
	DefaultVerifyInterval = 900 * time.Second
	// DefaultResumeRAMSeconds is slo.resumeRamSeconds' default.
	DefaultResumeRAMSeconds int32 = 1
	// DefaultResumeNVMeSeconds is slo.resumeNvmeSeconds' default.
	DefaultResumeNVMeSeconds int32 = 5
)

// The wake timeouts, one rule for every path. The per-engine sidecar
// bounds the engine's wake call by EngineWakeTimeout; whoever calls the
// sidecar (the lifecycle leader for an application, a seat group's
// executor for its members) waits WakeCallTimeout, the engine's bound plus
// WakeCallMargin for the call itself, so no caller gives up on a wake the
// sidecar still runs.
const (
	// EngineWakeTimeout bounds one engine's wake call in its sidecar.
	EngineWakeTimeout = 10 * time.Minute
	// WakeCallMargin is what a caller of the sidecar adds to the engine's
	// bound.
	WakeCallMargin = time.Minute
	// WakeCallTimeout bounds one call to a sidecar that wakes its engine.
	WakeCallTimeout = EngineWakeTimeout + WakeCallMargin
)

// The sleep timeouts, one rule for every path, like the wake's: the
// sidecar waits at most EngineDrainTimeout for its engine's requests in
// flight, then bounds the engine's sleep call by EngineSleepTimeout; whoever
// calls the sidecar waits SleepCallTimeout, both bounds plus
// SleepCallMargin.
const (
	// EngineDrainTimeout bounds the sidecar's wait for the engine's
	// requests in flight before a sleep.
	EngineDrainTimeout = 30 * time.Second
	// EngineSleepTimeout bounds one engine's sleep call in its sidecar.
	EngineSleepTimeout = 2 * time.Minute
	// SleepCallMargin is what a caller of the sidecar adds to its bounds.
	SleepCallMargin = 30 * time.Second
	// SleepCallTimeout bounds one call to a sidecar that puts its engine
	// to sleep.
	SleepCallTimeout = EngineDrainTimeout + EngineSleepTimeout + SleepCallMargin
	// StateCallTimeout bounds one GET /state of a sidecar, which answers
	// from what it knows; a sidecar that does not answer in time counts as
	// Unknown for that decision.
	StateCallTimeout = 5 * time.Second
)
