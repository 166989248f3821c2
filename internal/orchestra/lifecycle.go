package orchestra

import (
	"github.com/model-orchestra/operator/api/v1alpha1"
)

// defaultLifecycle fills the lifecycle defaults that depend on other
// fields: targetQueuePerReplica is serving.maxConcurrency, so that the
// backlog scaler adds a replica as soon as requests queue behind a full
// one.
func defaultLifecycle(app *v1alpha1.Application) {
	lc := app.Lifecycle
	if lc == nil {
		return
	}
	if lc.TargetQueuePerReplica == 0 {
		lc.TargetQueuePerReplica = max(app.Serving.MaxConcurrency, 1)
	}
	if lc.MaxReplicas == 0 {
		lc.MaxReplicas = 1
	}
	if lc.Scaler == "" {
		lc.Scaler = v1alpha1.ScalerBuiltin
	}
}

// lifecycleValues is an application's lifecycle as chart values; durations
// in Go's notation, which the dispatcher and gateway configs parse.
func lifecycleValues(lc *v1alpha1.LifecycleSpec) map[string]any {
	return map[string]any{
		"minReplicas":           int64(lc.MinReplicas),
		"maxReplicas":           int64(lc.MaxReplicas),
		"zeroAfter":             lc.ZeroAfter.Duration.String(),
		"targetQueuePerReplica": int64(lc.TargetQueuePerReplica),
		"maxWait":               lc.MaxWait.Duration.String(),
		"scaler":                string(lc.Scaler),
	}
}

// ownerValues identify the resource in the events the dispatcher records
// about lifecycle transitions (woke, scaled to zero), so that they show in
// kubectl describe of the resource.
func ownerValues(mo *v1alpha1.ModelOrchestra) map[string]any {
	return map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       v1alpha1.Kind,
		"name":       mo.Name,
		"uid":        string(mo.UID),
	}
}
