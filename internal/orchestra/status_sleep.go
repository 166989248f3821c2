package orchestra

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// sleepConditions are the conditions of sleeping applications:
//
//   - CheckpointPolicyResolved, while an application references a
//     CheckpointPolicy: False naming each one that cannot be read (its
//     applications run with their inline fields), else True;
//   - CheckpointFieldsSupported: False while a sleeping application sets a
//     field that is accepted but not acted on (unsupportedSleepFields),
//     naming each; True once none does;
//   - ResumeSLOAtRisk, while an application sleeps: True when an
//     application's expected resume time from its resident tier exceeds the
//     resume SLO of that tier (the message names the application, the tier
//     and both numbers), else False.
//
// The engine keeps a condition a status plugin once set, so a condition
// that no longer applies is not dropped but set to its all-clear value with
// a reason saying why; old holds the conditions of the last status.
// apps are the application statuses, with their lifecycle as the leader
// reported it.
func sleepConditions(mo *v1alpha1.ModelOrchestra, apps map[string]v1alpha1.ApplicationStatus, pols policies, old []metav1.Condition) []metav1.Condition {
	var out []metav1.Condition
	had := func(t string) bool { return meta.FindStatusCondition(old, t) != nil }

	switch {
	case len(pols.problems) > 0:
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionCheckpointPolicyResolved, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonPolicyNotFound,
			Message: pols.unresolved() + "; the applications that reference it sleep by their inline lifecycle fields only",
		})
	case len(pols.specs) > 0:
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionCheckpointPolicyResolved, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPoliciesResolved,
			Message: "every referenced CheckpointPolicy exists: " + strings.Join(sortedKeys(pols.specs), ", "),
		})
	case had(v1alpha1.ConditionCheckpointPolicyResolved):
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionCheckpointPolicyResolved, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonPoliciesResolved,
			Message: "no application references a CheckpointPolicy",
		})
	}

	var unsupported []string
	for _, name := range sortedKeys(mo.Spec.Applications) {
		app := mo.Spec.Applications[name]
		if sleep := effectiveSleep(app, pols); sleep.Enabled() || hasSeat(app) {
			unsupported = append(unsupported, unsupportedSleepFields(name, app, sleep, pols)...)
		}
	}
	switch {
	case len(unsupported) > 0:
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionCheckpointFieldsSupported, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonCheckpointUnsupported,
			Message: strings.Join(unsupported, "; "),
		})
	case had(v1alpha1.ConditionCheckpointFieldsSupported):
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionCheckpointFieldsSupported, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonCheckpointSupported,
			Message: "every checkpoint field the applications set is acted on",
		})
	}

	var sleeping, atRisk, within, unreported []string
	for _, name := range sortedKeys(mo.Spec.Applications) {
		app := mo.Spec.Applications[name]
		sleep := effectiveSleep(app, pols)
		if !sleep.Enabled() {
			continue
		}
		sleeping = append(sleeping, name)
		ls := apps[name].Lifecycle
		if ls == nil || ls.ExpectedResumeSeconds == "" {
			unreported = append(unreported, name)
			continue
		}
		slo, ok := sleep.SLOSeconds(ls.ResidentTier)
		if !ok {
			continue // awake, or cold: no resume SLO applies
		}
		expected, err := strconv.ParseFloat(ls.ExpectedResumeSeconds, 64)
		if err != nil {
			unreported = append(unreported, name)
			continue
		}
		if expected > float64(slo) {
			atRisk = append(atRisk, fmt.Sprintf("%s resumes from the %s tier in %s s, over its SLO of %d s", name, ls.ResidentTier, ls.ExpectedResumeSeconds, slo))
		} else {
			within = append(within, fmt.Sprintf("%s %s s from %s (SLO %d s)", name, ls.ExpectedResumeSeconds, ls.ResidentTier, slo))
		}
	}
	switch {
	case len(atRisk) > 0:
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionResumeSLOAtRisk, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonResumeSlowerThanSLO,
			Message: strings.Join(atRisk, "; "),
		})
	case len(sleeping) > 0:
		msg := "every sleeping application resumes within its SLO"
		if len(within) > 0 {
			msg += ": " + strings.Join(within, ", ")
		}
		if len(unreported) > 0 {
			msg += "; no expected resume time reported yet: " + strings.Join(unreported, ", ")
		}
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionResumeSLOAtRisk, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonResumeWithinSLO, Message: msg,
		})
	case had(v1alpha1.ConditionResumeSLOAtRisk):
		out = append(out, metav1.Condition{
			Type: v1alpha1.ConditionResumeSLOAtRisk, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonResumeWithinSLO,
			Message: "no application sleeps",
		})
	}
	return out
}

// unsupportedSleepFields names the checkpoint fields of a sleeping
// application that are accepted but not acted on, each with what happens
// instead.
func unsupportedSleepFields(name string, app v1alpha1.Application, sleep Sleep, pols policies) []string {
	var out []string
	if sleep.Tiers.Hot == v1alpha1.HotTierNone && sleep.Level == 1 {
		out = append(out, fmt.Sprintf("%s: tiers.hot is None, but its engine sleeps at level 1, which offloads the weights to node RAM; set lifecycle.sleepLevel 2 to keep them out of RAM", name))
	}
	if sleep.Tiers.Cold == v1alpha1.ColdTierS3 {
		out = append(out, fmt.Sprintf("%s: tiers.cold S3 is not supported; a cold wake reads the model cache, which the fetch Job fills from the model's source", name))
	}
	if p := pols.forApp(app); p != nil && p.Triggers.Preemption != nil {
		switch preempt := *p.Triggers.Preemption; {
		case preempt && !hasSeat(app):
			out = append(out, fmt.Sprintf("%s: triggers.preemption of CheckpointPolicy %s has no effect: only a seat group puts an engine to sleep before its idle time, and %s has no lifecycle.seat", name, app.Lifecycle.CheckpointPolicy, name))
		case !preempt && hasSeat(app):
			out = append(out, fmt.Sprintf("%s: triggers.preemption false of CheckpointPolicy %s is not honored: its seat group puts the engine to sleep to free the seat for another application", name, app.Lifecycle.CheckpointPolicy))
		}
	}
	return out
}

// processSnapshotsCondition is ProcessSnapshotsSupported, while an
// application asks for process snapshots (tiers.processSnapshots): False
// naming each node of its engines whose node agent reports it cannot take
// them and why (criu check; the container runtime, its version and the
// kubelet checkpoint API), Unknown while no node agent has reported, True
// when every reporting node can. Once none asks, a condition set before is
// turned True with reason ProcessSnapshotsOff; otherwise none is set. The
// node reports come from the applications' ModelCheckpoints (status.nodes),
// by application.
func processSnapshotsCondition(mo *v1alpha1.ModelOrchestra, pols policies, checkpoints map[string]*v1alpha1.ModelCheckpoint, old []metav1.Condition) *metav1.Condition {
	var asking, refused, unreported, able []string
	for _, name := range sortedKeys(mo.Spec.Applications) {
		sleep := effectiveSleep(mo.Spec.Applications[name], pols)
		if !sleep.Enabled() || !sleep.ProcessSnapshots() {
			continue
		}
		asking = append(asking, name)
		var nodes []v1alpha1.CheckpointNode
		if c := checkpoints[name]; c != nil {
			nodes = c.Status.Nodes
		}
		if len(nodes) == 0 {
			unreported = append(unreported, name)
			continue
		}
		for _, n := range nodes {
			if n.ProcessSnapshots {
				able = append(able, fmt.Sprintf("%s on %s", name, n.Node))
				continue
			}
			runtime := n.ContainerRuntimeVersion
			if runtime == "" {
				runtime = "unknown"
			}
			refused = append(refused, fmt.Sprintf("%s: node %s cannot take process snapshots (container runtime %s): %s", name, n.Node, runtime, n.ProcessSnapshotsReason))
		}
	}
	c := metav1.Condition{Type: v1alpha1.ConditionProcessSnapshotsSupported}
	switch {
	case len(refused) > 0:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonProcessSnapshotsUnsupported
		c.Message = strings.Join(refused, "; ") + "; no process snapshot is taken there, the engines sleep through their weights only"
	case len(unreported) > 0:
		c.Status, c.Reason = metav1.ConditionUnknown, v1alpha1.ReasonAwaitingNodeReport
		c.Message = "no node agent has reported on the nodes of " + strings.Join(unreported, ", ") + " yet; process snapshots are not taken until one says it can"
	case len(asking) > 0:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonProcessSnapshotsSupported
		c.Message = "the nodes can take process snapshots: " + strings.Join(able, ", ")
	case meta.FindStatusCondition(old, v1alpha1.ConditionProcessSnapshotsSupported) != nil:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonProcessSnapshotsOff
		c.Message = "no application asks for process snapshots"
	default:
		return nil
	}
	return &c
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
