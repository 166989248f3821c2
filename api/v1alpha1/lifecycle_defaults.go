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
