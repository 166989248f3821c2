package orchestra

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/fetch/s3cred"
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
// reported it; secrets are coldS3SecretProblems.
func sleepConditions(mo *v1alpha1.ModelOrchestra, apps map[string]v1alpha1.ApplicationStatus, pols policies, secrets map[string]string, old []metav1.Condition) []metav1.Condition {
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
			if why := secrets[name]; why != "" {
				unsupported = append(unsupported, why)
			}
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
	if _, why := ColdS3Location(name, app, sleep); why != "" {
		out = append(out, why)
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

// coldS3SecretProblems reads the credentials Secret of each application
// whose node agent reads its cold copy from S3 (ColdS3Location) and says,
// by application, why the agent cannot use it: the Secret does not exist,
// or lacks a key. The agent mounts it optional, so it still starts, and
// that application's copies fail. A Secret that cannot be read (no
// cluster, as in the offline preview, or another error) is not judged.
func coldS3SecretProblems(ctx context.Context, r client.Reader, mo *v1alpha1.ModelOrchestra, pols policies) map[string]string {
	out := map[string]string{}
	if r == nil {
		return out
	}
	for _, name := range sortedKeys(mo.Spec.Applications) {
		app := mo.Spec.Applications[name]
		c, why := ColdS3Location(name, app, effectiveSleep(app, pols))
		if why != "" || c.CredentialsSecret == "" {
			continue
		}
		getCtx, cancel := context.WithTimeout(ctx, policyReadTimeout)
		var sec corev1.Secret
		err := r.Get(getCtx, client.ObjectKey{Namespace: mo.Namespace, Name: c.CredentialsSecret}, &sec)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			out[name] = fmt.Sprintf("%s: tiers.cold is S3, but Secret %s/%s (model.credentialsSecretRef) does not exist: the node agent reads the bucket with it, and its copies from S3 fail until it does", name, mo.Namespace, c.CredentialsSecret)
		case err != nil:
			continue
		default:
			var missing []string
			for _, k := range []string{s3cred.AccessKeyName, s3cred.SecretKeyName} {
				if len(sec.Data[k]) == 0 { // stringData is write-only: the API server folds it into data
					missing = append(missing, k)
				}
			}
			if len(missing) > 0 {
				out[name] = fmt.Sprintf("%s: tiers.cold is S3, but Secret %s/%s (model.credentialsSecretRef) has no %s: the node agent reads the bucket with %s and %s", name, mo.Namespace, c.CredentialsSecret, strings.Join(missing, " or "), s3cred.AccessKeyName, s3cred.SecretKeyName)
			}
		}
	}
	return out
}
