package seatgroup

import (
	"errors"
	"fmt"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Defaults, in one place. docs/checkpoint.md ("Multiplexing") explains
// each.
const (
	// DefaultActiveSeats: one application awake at a time.
	DefaultActiveSeats = int(v1alpha1.DefaultActiveSeats)
	// DefaultMinResidency: a level-1 swap of a large model costs 3–6 s on
	// vLLM (0.3–0.8 s on small ones); holding a seat at least 30 s keeps
	// swaps under about a sixth of the seat's time however hard the
	// applications compete for it.
	DefaultMinResidency = v1alpha1.DefaultSeatMinResidency
	// DefaultMaxSwapWait: longer than a level-1 swap of a large model, far
	// below the gateway's 10-minute bound on a queued request.
	DefaultMaxSwapWait = 10 * time.Second
	// DefaultTick paces decisions when nothing kicks the executor; a new
	// request or a finished one kicks it at once.
	DefaultTick = time.Second
	// DefaultMaxResidentFraction: an asleep engine still holding more than
	// 5 % of its weights' bytes has not freed its memory. An engine keeps
	// some memory asleep (vLLM its CUDA context, a few hundred MiB against
	// weights of several GiB); a leak keeps all of it (vllm#47654).
	DefaultMaxResidentFraction = 0.05
	// DefaultWakeTimeout bounds one wake call to a sidecar and
	// DefaultSleepTimeout one sleep call: the rules every caller of a
	// sidecar follows (api/v1alpha1), the sidecar's own bound and a margin.
	DefaultWakeTimeout  = v1alpha1.WakeCallTimeout
	DefaultSleepTimeout = v1alpha1.SleepCallTimeout
	// DefaultStateTimeout bounds one GET /state; a sidecar that does not
	// answer in time counts as Unknown for that decision.
	DefaultStateTimeout = v1alpha1.StateCallTimeout
)

// Config configures the executor of one seat group.
type Config struct {
	// Name is the seat group, the group label of the metrics.
	Name string `json:"name"`
	// ActiveSeats is how many applications may be awake at once.
	ActiveSeats int `json:"activeSeats"`
	// MinResidency is the anti-thrash rule: a holder keeps its seat at
	// least this long unless the group is over budget.
	MinResidency time.Duration `json:"minResidency"`
	// MaxSwapWait: a waiting application whose oldest request waited this
	// long gets a busy holder drained, whatever their priorities.
	MaxSwapWait time.Duration `json:"maxSwapWait"`
	// Tick paces decisions between kicks.
	Tick time.Duration `json:"tick"`
	// MaxResidentFraction is the memory check: an asleep engine holding
	// more than this fraction of its weights' bytes is restarted before
	// another application wakes.
	MaxResidentFraction float64 `json:"maxResidentFraction"`
	// WakeTimeout bounds one wake call to a sidecar, SleepTimeout one
	// sleep call (its drain included), StateTimeout one GET /state.
	WakeTimeout  time.Duration `json:"wakeTimeout"`
	SleepTimeout time.Duration `json:"sleepTimeout"`
	StateTimeout time.Duration `json:"stateTimeout"`
}

// Default returns the defaults for a group named name.
func Default(name string) Config {
	return Config{
		Name:                name,
		ActiveSeats:         DefaultActiveSeats,
		MinResidency:        DefaultMinResidency,
		MaxSwapWait:         DefaultMaxSwapWait,
		Tick:                DefaultTick,
		MaxResidentFraction: DefaultMaxResidentFraction,
		WakeTimeout:         DefaultWakeTimeout,
		SleepTimeout:        DefaultSleepTimeout,
		StateTimeout:        DefaultStateTimeout,
	}
}

// Validate reports every invalid field; members are the group's
// applications.
func (c Config) Validate(members []Member) error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if c.Name == "" {
		bad("seat group name must not be empty")
	}
	if c.ActiveSeats < 1 {
		bad("seat group %s: activeSeats must be at least 1, got %d", c.Name, c.ActiveSeats)
	}
	if c.MinResidency < 0 {
		bad("seat group %s: minResidency must not be negative, got %v", c.Name, c.MinResidency)
	}
	if c.MaxSwapWait <= 0 {
		bad("seat group %s: maxSwapWait must be positive, got %v", c.Name, c.MaxSwapWait)
	}
	if c.Tick <= 0 {
		bad("seat group %s: tick must be positive, got %v", c.Name, c.Tick)
	}
	for _, t := range []struct {
		name string
		d    time.Duration
	}{{"wakeTimeout", c.WakeTimeout}, {"sleepTimeout", c.SleepTimeout}, {"stateTimeout", c.StateTimeout}} {
		if t.d <= 0 {
			bad("seat group %s: %s must be positive, got %v", c.Name, t.name, t.d)
		}
	}
	if c.MaxResidentFraction < 0 || c.MaxResidentFraction >= 1 {
		bad("seat group %s: maxResidentFraction must be within [0, 1), got %v", c.Name, c.MaxResidentFraction)
	}
	if len(members) == 0 {
		bad("seat group %s has no applications", c.Name)
	}
	seen := map[string]bool{}
	for i, m := range members {
		switch {
		case m.Name == "":
			bad("seat group %s: application %d has no name", c.Name, i)
		case seen[m.Name]:
			bad("seat group %s: application %q is listed twice", c.Name, m.Name)
		}
		seen[m.Name] = true
		if m.Sidecar == nil {
			bad("seat group %s: application %q has no sidecar", c.Name, m.Name)
		}
		if m.SleepLevel != 0 && m.SleepLevel != 1 && m.SleepLevel != 2 {
			bad("seat group %s: application %q: sleep level must be 1 or 2, got %d", c.Name, m.Name, m.SleepLevel)
		}
		if m.WeightsBytes < 0 || m.SwapCost < 0 {
			bad("seat group %s: application %q: weights bytes and swap cost must not be negative", c.Name, m.Name)
		}
	}
	if len(members) > 0 && c.ActiveSeats >= len(members) {
		bad("seat group %s: activeSeats %d leaves nothing to multiplex among %d applications", c.Name, c.ActiveSeats, len(members))
	}
	return errors.Join(errs...)
}
