package manager

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestUpgradeableCondition(t *testing.T) {
	secret := func(ns, name, status, version string, extra ...string) metav1.PartialObjectMetadata {
		m := metav1.PartialObjectMetadata{}
		m.Namespace = ns
		m.Labels = map[string]string{"owner": "helm", "name": name, "status": status, "version": version}
		if len(extra) == 2 {
			m.Labels[extra[0]] = extra[1]
		}
		return m
	}
	tests := []struct {
		name    string
		secrets []metav1.PartialObjectMetadata
		status  metav1.ConditionStatus
		reason  string
		message []string
	}{
		{"no release", nil, metav1.ConditionTrue, ReasonNoReleasePending, []string{"no Helm release is pending"}},
		{"settled releases", []metav1.PartialObjectMetadata{
			secret("a", "chat", "deployed", "3"), secret("a", "chat", "superseded", "2"), secret("b", "x", "failed", "1"),
		}, metav1.ConditionTrue, ReasonNoReleasePending, nil},
		{"install in flight", []metav1.PartialObjectMetadata{secret("a", "chat", "pending-install", "1")},
			metav1.ConditionFalse, ReasonReleasePending, []string{"a/chat is pending-install (revision 1)"}},
		{"upgrade, rollback and uninstall", []metav1.PartialObjectMetadata{
			secret("b", "y", "pending-rollback", "4"), secret("a", "chat", "pending-upgrade", "2"), secret("c", "z", "uninstalling", "7"), secret("a", "chat", "deployed", "1"),
		}, metav1.ConditionFalse, ReasonReleasePending, []string{"a/chat is pending-upgrade (revision 2), b/y is pending-rollback (revision 4), c/z is uninstalling (revision 7)"}},
		{"not a Helm release", []metav1.PartialObjectMetadata{secret("a", "chat", "pending-install", "1", "owner", "someone")},
			metav1.ConditionTrue, ReasonNoReleasePending, nil},
		{"many", []metav1.PartialObjectMetadata{
			secret("a", "r1", "pending-install", "1"), secret("a", "r2", "pending-install", "1"), secret("a", "r3", "pending-install", "1"),
			secret("a", "r4", "pending-install", "1"), secret("a", "r5", "pending-install", "1"), secret("a", "r6", "pending-install", "1"), secret("a", "r7", "pending-install", "1"),
		}, metav1.ConditionFalse, ReasonReleasePending, []string{"a/r5 is pending-install", "and 2 more"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := upgradeableCondition(tc.secrets)
			if got.Type != "Upgradeable" || got.Status != tc.status || got.Reason != tc.reason {
				t.Fatalf("got %s=%s (%s), want %s (%s): %s", got.Type, got.Status, got.Reason, tc.status, tc.reason, got.Message)
			}
			for _, m := range tc.message {
				if !strings.Contains(got.Message, m) {
					t.Errorf("message %q lacks %q", got.Message, m)
				}
			}
		})
	}
}
