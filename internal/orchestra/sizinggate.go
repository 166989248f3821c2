package orchestra

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/modelsize"
)

// The sizing gate: an application whose fetch Job checks the model's
// memory (a memory limit, or a GPU product of known memory, and no
// ignoreMemoryLimit) gets no engine pod until the fetcher's verdict for
// the current check says the model fits. Until then its root (and worker)
// StatefulSets are rendered with zero replicas, and the lifecycle leader
// is not given the application; a refusal keeps them there and makes the
// gateway answer its model's requests with the refusal instead of queueing
// them. The verdict is read from the progress ConfigMap the fetcher
// writes (the same report the status plugin reads), so the render that
// follows the fetcher's last report already has it.

// sizingGate is what the verdict means for an application's engine.
type sizingGate struct {
	// Hold renders the engine at zero replicas.
	Hold bool
	// Refused is the refusal with its numbers, for the gateway; empty
	// while the check is pending and when the model fits.
	Refused string
}

// sizingChecks reports whether app's fetch Job may refuse its model: only
// then does the engine wait for the verdict. Seat group members are not
// held: their engines run in the group's pods.
func sizingChecks(app v1alpha1.Application) bool {
	sz := sizingValues(app)
	if sz == nil || sz["ignoreMemoryLimit"].(bool) || hasSeat(app) {
		return false
	}
	if sz["memoryLimit"].(int64) > 0 {
		return true
	}
	_, known := modelsize.GPUMemory(sz["gpuProduct"].(string))
	return known && sz["gpus"].(int64) > 0
}

// decideSizingGate is the gate for app given the fetcher's last report
// (nil: none yet). A verdict counts only when it was made for the check
// the current spec asks for (context, concurrency, limits, margin), so a
// report left by the previous fetch Job holds the engine until the new
// one has sized the model.
func decideSizingGate(app v1alpha1.Application, p *fetchProgress) sizingGate {
	if !sizingChecks(app) {
		return sizingGate{}
	}
	if p == nil || p.Sizing == nil {
		return sizingGate{Hold: true}
	}
	want, got := sizingValues(app), p.Sizing
	if (want["context"].(int64) > 0 && got.Context != want["context"].(int64)) || got.Parallel != want["parallel"].(int64) ||
		got.MemoryLimitBytes != want["memoryLimit"].(int64) || got.MarginPercent != want["marginPercent"].(int64) ||
		got.GPUs != want["gpus"].(int64) || got.GPUProduct != want["gpuProduct"].(string) {
		return sizingGate{Hold: true}
	}
	if got.Fits {
		return sizingGate{}
	}
	why := strings.TrimPrefix(p.Message, "verification failed: ")
	if why == "" {
		why = fmt.Sprintf("the model does not fit: it needs about %s, the limit is %s", modelsize.Bytes(got.MemoryBytes), modelsize.Bytes(got.MemoryLimitBytes))
	}
	return sizingGate{Hold: true, Refused: why}
}

// sizingGates reads the fetchers' reports of the applications whose model
// is checked. Without a cluster (no reader, or the offline preview's)
// there is no verdict to wait for: the engines render as they run once
// their model fits.
func sizingGates(ctx context.Context, r client.Reader, mo *v1alpha1.ModelOrchestra) (map[string]sizingGate, error) {
	out := map[string]sizingGate{}
	if r == nil {
		return out, nil
	}
	for name, app := range mo.Spec.Applications {
		if !sizingChecks(app) {
			continue
		}
		var cms corev1.ConfigMapList
		if err := r.List(ctx, &cms, client.InNamespace(mo.Namespace), client.MatchingLabels{
			"app.kubernetes.io/instance": mo.Name, labelComponent: "model-progress", labelApplication: name,
		}); errors.Is(err, ErrOffline) {
			return map[string]sizingGate{}, nil
		} else if err != nil {
			// Not a reason to fail the render (it would wait for the
			// resource to change) nor to take a running engine down: the
			// engine's wait-for-model init container still waits for the
			// verdict, and the next reconcile reads it again.
			log.FromContext(ctx).Error(err, "reading the model progress report; the engine is not held", "application", name)
			continue
		}
		var p *fetchProgress
		for i := range cms.Items {
			if raw, ok := cms.Items[i].Data[progressKey]; ok {
				var fp fetchProgress
				if json.Unmarshal([]byte(raw), &fp) == nil {
					p = &fp
				}
			}
		}
		out[name] = decideSizingGate(app, p)
	}
	return out, nil
}
