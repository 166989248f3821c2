package helmreconciler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Condition types set on every custom resource the engine serves.
const (
	// TypeInitialized is True once the engine has taken the resource on.
	TypeInitialized = "Initialized"
	// TypeDeployed is True while a release of the resource is deployed.
	TypeDeployed = "Deployed"
	// TypeReleaseFailed is True when the last Helm action failed.
	TypeReleaseFailed = "ReleaseFailed"
	// TypeIrreconcilable is True when the resource cannot be reconciled
	// until it changes (invalid values) or the cluster does.
	TypeIrreconcilable = "Irreconcilable"
	// TypePaused is True while the pause-reconcile annotation is "true".
	TypePaused = "Paused"
)

// Reason is a condition and event reason.
type Reason string

// Condition and event reasons.
const (
	ReasonInitialized         Reason = "Initialized"
	ReasonInstallSuccessful   Reason = "InstallSuccessful"
	ReasonUpgradeSuccessful   Reason = "UpgradeSuccessful"
	ReasonUninstallSuccessful Reason = "UninstallSuccessful"
	ReasonRollbackSuccessful  Reason = "RollbackSuccessful"
	ReasonUpToDate            Reason = "UpToDate"
	ReasonInstallFailed       Reason = "InstallFailed"
	ReasonUpgradeFailed       Reason = "UpgradeFailed"
	ReasonRollbackFailed      Reason = "RollbackFailed"
	ReasonUninstallFailed     Reason = "UninstallFailed"
	ReasonNotInstalled        Reason = "NotInstalled"
	ReasonReleaseSucceeded    Reason = "ReleaseSucceeded"
	ReasonValuesInvalid       Reason = "ValuesInvalid"
	ReasonReconcileError      Reason = "ReconcileError"
	ReasonStatusPluginError   Reason = "StatusPluginError"
	ReasonReconciled          Reason = "Reconciled"
	ReasonReleaseRecovered    Reason = "ReleaseRecovered"
	ReasonDriftRepaired       Reason = "DriftRepaired"
	ReasonPaused              Reason = "PauseReconcileAnnotationTrue"
	ReasonNotPaused           Reason = "NotPaused"
	ReasonUninstallWaiting    Reason = "WaitingForObjectsGone"
	ReasonPreviousRelease     Reason = "WaitingForPreviousReleaseGone"
)

// Keys of .status that belong to the engine. A status plugin may not set
// them; every other key it sets is kept.
const (
	statusConditions         = "conditions"
	statusDeployedRelease    = "deployedRelease"
	statusObservedGeneration = "observedGeneration"
)

// DeployedRelease is .status.deployedRelease. The manifest is left out: it
// can be large and `helm get manifest` shows it.
type DeployedRelease struct {
	Name     string `json:"name"`
	Revision int    `json:"revision"`
	Chart    string `json:"chart"`
	Version  string `json:"version"`
	Digest   string `json:"digest"`
}

// status is the engine's view of a custom resource's .status during one
// reconcile. It is written once, at the end, and only when it changed.
type status struct {
	old        map[string]any
	extra      map[string]any // status plugin fields, kept across reconciles
	conditions []metav1.Condition
	deployed   *DeployedRelease
	generation int64
}

func statusFrom(obj *unstructured.Unstructured) *status {
	old, _, _ := unstructured.NestedMap(obj.Object, "status")
	s := &status{old: old, extra: map[string]any{}, generation: obj.GetGeneration()}
	for k, v := range old {
		switch k {
		case statusConditions:
			s.conditions = conditionsFrom(v)
		case statusDeployedRelease:
			if d := deployedFrom(v); d.Name != "" {
				s.deployed = &d
			}
		case statusObservedGeneration:
		default:
			s.extra[k] = v
		}
	}
	return s
}

func (s *status) set(t string, st metav1.ConditionStatus, r Reason, format string, args ...any) {
	meta.SetStatusCondition(&s.conditions, metav1.Condition{
		Type: t, Status: st, Reason: string(r), Message: fmt.Sprintf(format, args...),
		ObservedGeneration: s.generation,
	})
}

func (s *status) isTrue(t string) bool { return meta.IsStatusConditionTrue(s.conditions, t) }

// merge sets the status plugin's contribution.
func (s *status) merge(fields map[string]any, conds []metav1.Condition) error {
	for k, v := range fields {
		switch k {
		case statusConditions, statusDeployedRelease, statusObservedGeneration:
			return fmt.Errorf("status plugin may not set .status.%s", k)
		}
		s.extra[k] = v
	}
	for _, c := range conds {
		switch c.Type {
		case TypeInitialized, TypeDeployed, TypeReleaseFailed, TypeIrreconcilable, TypePaused:
			return fmt.Errorf("status plugin may not set the engine's condition %s", c.Type)
		}
		c.ObservedGeneration = s.generation
		meta.SetStatusCondition(&s.conditions, c)
	}
	return nil
}

// build returns the new .status and whether it differs from the old one.
// The engine's own fields are built as the API server returns them (the
// JSON forms of their types, numbers as int64); the status plugin's
// fields, which may be of any type, go through JSON.
func (s *status) build() (map[string]any, bool, error) {
	out := map[string]any{}
	if len(s.extra) > 0 {
		b, err := json.Marshal(s.extra)
		if err != nil {
			return nil, false, fmt.Errorf("encoding status: %w", err)
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return nil, false, fmt.Errorf("encoding status: %w", err)
		}
		out = numbers(out).(map[string]any)
	}
	if len(s.conditions) > 0 {
		conds := make([]any, len(s.conditions))
		for i, c := range s.conditions {
			conds[i] = conditionJSON(c)
		}
		out[statusConditions] = conds
	}
	if d := s.deployed; d != nil {
		out[statusDeployedRelease] = map[string]any{
			"name": d.Name, "revision": int64(d.Revision), "chart": d.Chart, "version": d.Version, "digest": d.Digest,
		}
	}
	out[statusObservedGeneration] = s.generation
	return out, !equality.Semantic.DeepEqual(out, s.old), nil
}

// conditionJSON is c as encoding/json writes it.
func conditionJSON(c metav1.Condition) map[string]any {
	m := map[string]any{"type": c.Type, "status": string(c.Status), "reason": c.Reason, "message": c.Message, "lastTransitionTime": nil}
	if c.ObservedGeneration != 0 {
		m["observedGeneration"] = c.ObservedGeneration
	}
	if !c.LastTransitionTime.IsZero() {
		m["lastTransitionTime"] = c.LastTransitionTime.UTC().Format(time.RFC3339)
	}
	return m
}

// conditionsFrom reads .status.conditions as encoding/json would.
func conditionsFrom(v any) []metav1.Condition {
	list, _ := v.([]any)
	out := make([]metav1.Condition, 0, len(list))
	for _, e := range list {
		m, ok := e.(map[string]any)
		if !ok {
			continue
		}
		c := metav1.Condition{ObservedGeneration: int64Of(m["observedGeneration"])}
		c.Type, _ = m["type"].(string)
		st, _ := m["status"].(string)
		c.Status = metav1.ConditionStatus(st)
		c.Reason, _ = m["reason"].(string)
		c.Message, _ = m["message"].(string)
		if ts, ok := m["lastTransitionTime"].(string); ok {
			if t, err := time.Parse(time.RFC3339, ts); err == nil {
				c.LastTransitionTime = metav1.NewTime(t.Local())
			}
		}
		out = append(out, c)
	}
	return out
}

// deployedFrom reads .status.deployedRelease.
func deployedFrom(v any) DeployedRelease {
	m, _ := v.(map[string]any)
	var d DeployedRelease
	d.Name, _ = m["name"].(string)
	d.Revision = int(int64Of(m["revision"]))
	d.Chart, _ = m["chart"].(string)
	d.Version, _ = m["version"].(string)
	d.Digest, _ = m["digest"].(string)
	return d
}

func int64Of(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	case int:
		return int64(n)
	}
	return 0
}

// numbers turns whole float64 values into int64, as the API server's JSON
// decoding does, so that an unchanged status compares equal.
func numbers(v any) any {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			t[k] = numbers(e)
		}
	case []any:
		for i, e := range t {
			t[i] = numbers(e)
		}
	case float64:
		if t == float64(int64(t)) {
			return int64(t)
		}
	}
	return v
}

// writeStatus writes .status if it changed.
func (r *Reconciler) writeStatus(ctx context.Context, obj *unstructured.Unstructured, st *status) error {
	s, changed, err := st.build()
	if err != nil || !changed {
		return err
	}
	obj.Object["status"] = s
	if err := r.client.Status().Update(ctx, obj); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		if apierrors.IsConflict(err) {
			return fmt.Errorf("writing status: %w: %w", errStaleStatus, err)
		}
		return fmt.Errorf("writing status: %w", err)
	}
	return nil
}

// errStaleStatus: the status write found a newer resource than the one the
// reconcile read; the reconcile is retried, without reporting an error.
var errStaleStatus = errors.New("the resource changed since it was read")

// staleStatusRetry is how soon a reconcile whose status write met a newer
// resource runs again: the cache is normally that far behind at most.
const staleStatusRetry = 100 * time.Millisecond
