package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/model-orchestra/operator/internal/sidecarapi"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// VLLM drives vLLM's sleep mode (also the simulator's, which mimics it). It
// needs the engine started with --enable-sleep-mode and
// VLLM_SERVER_DEV_MODE=1; those dev endpoints are unauthenticated, so they
// must stay pod-local: the sidecar reaches them over localhost.
type VLLM struct {
	httpEngine
	kind v1alpha1.Engine

	mu    sync.Mutex
	level int // the level of the last sleep, which decides the wake sequence
	last  *sidecarapi.Transfer
}

// LastTransfer implements TransferReporter: what the last sleep or wake
// reported moving. vLLM itself reports nothing; the simulator answers its
// sleep and wake calls with a stage report (tier, bytes, verified).
func (v *VLLM) LastTransfer() *sidecarapi.Transfer {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.last
}

// transferOf reads a stage report from an engine's answer, directly or as
// collective_rpc's {"results": [report]}; nil when the answer has none.
func transferOf(b []byte) *sidecarapi.Transfer {
	var t sidecarapi.Transfer
	if json.Unmarshal(b, &t) == nil && (t.Tier != "" || t.Bytes > 0) {
		return &t
	}
	var rpc struct {
		Results []sidecarapi.Transfer `json:"results"`
	}
	if json.Unmarshal(b, &rpc) == nil && len(rpc.Results) > 0 && (rpc.Results[0].Tier != "" || rpc.Results[0].Bytes > 0) {
		return &rpc.Results[0]
	}
	return nil
}

// ReloadsWeights implements WeightsReloader: after a level-2 sleep the
// wake reloads the weights from the --model path (POST /collective_rpc
// {"method":"reload_weights"}, which reads the model's files again: with
// model copies the sidecar's link, pointed at the hottest verified copy
// just before); after a level-1 sleep they come back from vLLM's own CPU
// RAM.
func (v *VLLM) ReloadsWeights() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.level == 2
}

// Name implements Engine.
func (v *VLLM) Name() v1alpha1.Engine { return v.kind }

// Restart implements Restarter for the simulator run with --restartable
// (POST /orchestra/restart); vLLM itself, and a simulator without
// --restartable, cannot restart in place (ErrRestartUnsupported: the sidecar
// then stops its processes when it may). The restarted engine starts on
// its next wake, with a plain /wake_up.
func (v *VLLM) Restart(ctx context.Context) error {
	if v.kind != v1alpha1.EngineSimulator {
		return fmt.Errorf("%w: %s has no in-place restart; only its container's restart would free its memory", ErrRestartUnsupported, v.kind)
	}
	if err := v.call(ctx, http.MethodPost, "/orchestra/restart", nil, nil); err != nil {
		var ee *EngineError
		if errors.As(err, &ee) && (ee.Status == http.StatusNotFound || ee.Status == http.StatusMethodNotAllowed) {
			return fmt.Errorf("%w: the simulator runs without --restartable (%w)", ErrRestartUnsupported, err)
		}
		return err
	}
	v.mu.Lock()
	v.level, v.last = 1, nil
	v.mu.Unlock()
	return nil
}

// InFlight reads vllm:num_requests_running + vllm:num_requests_waiting.
func (v *VLLM) InFlight(ctx context.Context) (int, error) {
	n, found, err := v.promGauges(ctx, "vllm:num_requests_running", "vllm:num_requests_waiting")
	if err != nil {
		return -1, err
	}
	if !found {
		return -1, nil
	}
	return int(n), nil
}

// Sleep checks that nothing is in flight, calls POST /sleep?level=N and
// then checks GET /is_sleeping: a 200 from /sleep alone proves nothing
// (vllm-project/vllm#45520).
func (v *VLLM) Sleep(ctx context.Context, level int) error {
	if level != 1 && level != 2 {
		return fmt.Errorf("vLLM sleep level must be 1 or 2, got %d", level)
	}
	if n, err := v.InFlight(ctx); err != nil {
		return fmt.Errorf("checking in-flight requests before sleeping: %w", err)
	} else if n > 0 {
		return fmt.Errorf("%w: %d requests (vllm:num_requests_running + waiting); drain first", ErrBusy, n)
	}
	answer, err := v.callBody(ctx, http.MethodPost, fmt.Sprintf("/sleep?level=%d", level), nil)
	if err != nil {
		return err
	}
	asleep, err := v.Sleeping(ctx)
	if err != nil {
		return fmt.Errorf("checking is_sleeping after /sleep: %w", err)
	}
	if !asleep {
		return fmt.Errorf("vLLM answered /sleep?level=%d but GET /is_sleeping says it is awake", level)
	}
	v.mu.Lock()
	v.level, v.last = level, transferOf(answer)
	v.mu.Unlock()
	return nil
}

// Wake runs the documented sequence: after level 1, POST /wake_up; after
// level 2, POST /wake_up?tags=weights, POST /collective_rpc
// {"method":"reload_weights"}, POST /wake_up?tags=kv_cache and POST
// /reset_prefix_cache. It then checks GET /is_sleeping.
func (v *VLLM) Wake(ctx context.Context) error {
	v.mu.Lock()
	level := v.level
	v.mu.Unlock()
	var moved *sidecarapi.Transfer
	if level == 2 {
		steps := []struct {
			path string
			body any
		}{
			{"/wake_up?tags=weights", nil},
			{"/collective_rpc", map[string]any{"method": "reload_weights"}},
			{"/wake_up?tags=kv_cache", nil},
			{"/reset_prefix_cache", nil},
		}
		for _, s := range steps {
			answer, err := v.callBody(ctx, http.MethodPost, s.path, s.body)
			if err != nil {
				return fmt.Errorf("level-2 wake: %w", err)
			}
			if t := transferOf(answer); t != nil && t.Tier != "" {
				moved = t // reload_weights fills the weights
			}
		}
	} else {
		answer, err := v.callBody(ctx, http.MethodPost, "/wake_up", nil)
		if err != nil {
			return err
		}
		moved = transferOf(answer)
	}
	asleep, err := v.Sleeping(ctx)
	if err != nil {
		return fmt.Errorf("checking is_sleeping after the wake: %w", err)
	}
	if asleep {
		return fmt.Errorf("vLLM answered the wake but GET /is_sleeping still says it sleeps")
	}
	v.mu.Lock()
	v.level, v.last = 0, moved
	v.mu.Unlock()
	return nil
}

// Sleeping reads GET /is_sleeping.
func (v *VLLM) Sleeping(ctx context.Context) (bool, error) {
	var r struct {
		IsSleeping *bool `json:"is_sleeping"`
	}
	if err := v.call(ctx, http.MethodGet, "/is_sleeping", nil, &r); err != nil {
		return false, err
	}
	if r.IsSleeping == nil {
		return false, fmt.Errorf("GET /is_sleeping: no is_sleeping field")
	}
	return *r.IsSleeping, nil
}

// Weights implements WeightsReporter: the simulator reports its weights
// (GET /orchestra/weights); vLLM has no such endpoint.
func (v *VLLM) Weights(ctx context.Context) (EngineWeights, bool, error) {
	if v.kind != v1alpha1.EngineSimulator {
		return EngineWeights{}, false, nil
	}
	var w EngineWeights
	if err := v.call(ctx, http.MethodGet, "/orchestra/weights", nil, &w); err != nil {
		return EngineWeights{}, false, err
	}
	return w, true, nil
}
