package helmreconciler

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
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
			b, _ := json.Marshal(v)
			_ = json.Unmarshal(b, &s.conditions)
		case statusDeployedRelease:
			b, _ := json.Marshal(v)
			var d DeployedRelease
			if json.Unmarshal(b, &d) == nil && d.Name != "" {
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
func (s *status) build() (map[string]any, bool, error) {
	out := map[string]any{}
	for k, v := range s.extra {
		out[k] = v
	}
	if len(s.conditions) > 0 {
		out[statusConditions] = s.conditions
	}
	if s.deployed != nil {
		out[statusDeployedRelease] = s.deployed
	}
	out[statusObservedGeneration] = s.generation
	b, err := json.Marshal(out)
	if err != nil {
		return nil, false, fmt.Errorf("encoding status: %w", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, false, fmt.Errorf("encoding status: %w", err)
	}
	m = runtime.DeepCopyJSON(numbers(m).(map[string]any))
	return m, !equality.Semantic.DeepEqual(m, s.old), nil
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
