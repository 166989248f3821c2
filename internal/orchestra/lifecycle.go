package orchestra

import (
	"encoding/json"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"

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
// in Go's notation, which the dispatcher and gateway configs parse. sleep
// is its effective sleep: the sleep value is written when the application
// sleeps when idle or shares a seat (its seat group puts it to sleep to
// free the seat; without sleepAfter its sleep has no "after"), and seat
// only when it has one.
func lifecycleValues(lc *v1alpha1.LifecycleSpec, sleep Sleep) map[string]any {
	out := map[string]any{
		"minReplicas":           int64(lc.MinReplicas),
		"maxReplicas":           int64(lc.MaxReplicas),
		"zeroAfter":             lc.ZeroAfter.Duration.String(),
		"targetQueuePerReplica": int64(lc.TargetQueuePerReplica),
		"maxWait":               lc.MaxWait.Duration.String(),
		"scaler":                string(lc.Scaler),
	}
	if sleep.Enabled() || lc.Seat != nil {
		out["sleep"] = sleepValues(sleep)
	}
	if lc.Seat != nil {
		out["seat"] = seatValues(lc.Seat)
	}
	return out
}

// effectiveSleep is app's effective sleep with the policy it references,
// when that was resolved. distributed-llama never sleeps: it has no sleep
// or unload API (the CRD refuses its sleep fields; this guards resources
// that did not pass through the API server, such as previews).
func effectiveSleep(app v1alpha1.Application, pols policies) Sleep {
	if app.Lifecycle == nil || app.Runtime.Engine == v1alpha1.EngineDllama {
		return Sleep{}
	}
	return EffectiveSleep(app.Lifecycle, pols.forApp(app))
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

// lifecycleStatus fills the status of an application with a lifecycle:
// its replica count is the one the lifecycle set (not scaling.replicas),
// and at zero pods it is Idle, while its pods start Waking, while its
// engines sleep Asleep (its roots are not ready then: a sleeping root
// leaves the Service's endpoints). It sets st.Phase only for those three
// phases; the caller derives the others.
func lifecycleStatus(st *v1alpha1.ApplicationStatus, name string, app v1alpha1.Application, root *appsv1.StatefulSet) {
	if root == nil {
		return
	}
	st.Replicas = 1 // the API server's default when the chart leaves it out
	if root.Spec.Replicas != nil {
		st.Replicas = *root.Spec.Replicas
	}
	st.Workers = st.Replicas * app.Runtime.Workers
	key := v1alpha1.LifecycleStatusAnnotation(name, hasSeat(app)) // a group's StatefulSet is shared
	var ls v1alpha1.LifecycleStatus
	if raw, ok := root.Annotations[key]; ok && json.Unmarshal([]byte(raw), &ls) == nil {
		st.Lifecycle = &ls
	}
	switch {
	case st.Replicas == 0 && st.Lifecycle != nil && st.Lifecycle.Parked != nil:
		st.Phase = v1alpha1.PhaseIdle
		st.Message = parkedMessage(st.Lifecycle.Parked)
	case st.Replicas == 0:
		st.Phase = v1alpha1.PhaseIdle
		st.Message = fmt.Sprintf("at zero pods after %v without requests; the next request wakes it", app.Lifecycle.ZeroAfter.Duration)
	case st.Lifecycle != nil && st.Lifecycle.State == v1alpha1.LifecycleAsleep:
		st.Phase = v1alpha1.PhaseAsleep
		st.Message = "asleep: its engines wait with their weights in the " + tierOrUnknown(st.Lifecycle.ResidentTier) + " tier; the next request wakes them"
		if s := st.Lifecycle.ExpectedResumeSeconds; s != "" {
			st.Message += " in about " + s + " s"
		}
	case st.ReadyReplicas == 0 && st.Lifecycle != nil && st.Lifecycle.State == v1alpha1.LifecycleWaking:
		st.Phase = v1alpha1.PhaseWaking
		st.Message = "waking: its pods are starting; requests wait in the queue"
		if st.Lifecycle.Message != "" {
			st.Message = "cannot wake: " + st.Lifecycle.Message
		}
	}
}

func tierOrUnknown(t v1alpha1.Tier) string {
	if t == "" {
		return "(not yet reported)"
	}
	return string(t)
}

// parkedMessage is the message of a parked application: where its copies
// are, and where its next wake prefers to run.
func parkedMessage(p *v1alpha1.ParkedStatus) string {
	msg := "parked: its pods were scaled away after parkAfter asleep, freeing their accelerators; "
	if len(p.Copies) == 0 {
		return msg + "no node agent holds a copy of its weights; the next request wakes it from zero and reads the cold tier"
	}
	copies := make([]string, len(p.Copies))
	for i, c := range p.Copies {
		copies[i] = string(c.Tier) + " on " + c.Node
	}
	return msg + "the node agents keep its weights (" + strings.Join(copies, ", ") + "); the next request wakes it from zero, preferring those nodes"
}
