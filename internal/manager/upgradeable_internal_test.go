package manager

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/helmreconciler"
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
	action := func(a, ns, rel string) helmreconciler.HelmAction {
		return helmreconciler.HelmAction{Action: a, Namespace: ns, Release: rel}
	}
	const tail = "; the operator must not be replaced until the Helm actions finish"
	type want struct {
		Status  metav1.ConditionStatus
		Reason  string
		Message string
	}
	settled := want{metav1.ConditionTrue, ReasonNoReleasePending, "no Helm action is running and no Helm release is pending"}
	tests := []struct {
		name    string
		running []helmreconciler.HelmAction
		secrets []metav1.PartialObjectMetadata
		want    want
	}{
		{"nothing", nil, nil, settled},
		{"settled releases", nil, []metav1.PartialObjectMetadata{
			secret("a", "chat", "deployed", "3"), secret("a", "chat", "superseded", "2"), secret("b", "x", "failed", "1"),
		}, settled},
		{"install record pending", nil, []metav1.PartialObjectMetadata{secret("a", "chat", "pending-install", "1")},
			want{metav1.ConditionFalse, ReasonReleasePending, "Helm a/chat is pending-install (revision 1)" + tail}},
		{"upgrade, rollback and uninstall records", nil, []metav1.PartialObjectMetadata{
			secret("b", "y", "pending-rollback", "4"), secret("a", "chat", "pending-upgrade", "2"), secret("c", "z", "uninstalling", "7"), secret("a", "chat", "deployed", "1"),
		}, want{metav1.ConditionFalse, ReasonReleasePending, "Helm a/chat is pending-upgrade (revision 2), b/y is pending-rollback (revision 4), c/z is uninstalling (revision 7)" + tail}},
		{"not a Helm release", nil, []metav1.PartialObjectMetadata{secret("a", "chat", "pending-install", "1", "owner", "someone")}, settled},
		// A hookless install's record is deployed before its objects
		// exist: only the running action says it is in flight.
		{"hookless install running", []helmreconciler.HelmAction{action("install", "a", "chat")}, []metav1.PartialObjectMetadata{secret("a", "chat", "deployed", "1")},
			want{metav1.ConditionFalse, ReasonActionInFlight, "Helm install of a/chat is running" + tail}},
		{"running action and its pending record named once", []helmreconciler.HelmAction{action("upgrade", "a", "chat")}, []metav1.PartialObjectMetadata{
			secret("a", "chat", "pending-upgrade", "2"), secret("b", "y", "pending-install", "1"),
		}, want{metav1.ConditionFalse, ReasonActionInFlight, "Helm upgrade of a/chat is running, b/y is pending-install (revision 1)" + tail}},
		{"actions sorted", []helmreconciler.HelmAction{action("uninstall", "b", "x"), action("install", "a", "z"), action("purge", "a", "chat"), action("install", "a", "chat")}, nil,
			want{metav1.ConditionFalse, ReasonActionInFlight, "Helm install of a/chat is running, purge of a/chat is running, install of a/z is running, uninstall of b/x is running" + tail}},
		{"many", nil, []metav1.PartialObjectMetadata{
			secret("a", "r1", "pending-install", "1"), secret("a", "r2", "pending-install", "1"), secret("a", "r3", "pending-install", "1"),
			secret("a", "r4", "pending-install", "1"), secret("a", "r5", "pending-install", "1"), secret("a", "r6", "pending-install", "1"), secret("a", "r7", "pending-install", "1"),
		}, want{metav1.ConditionFalse, ReasonReleasePending, "Helm a/r1 is pending-install (revision 1), a/r2 is pending-install (revision 1), a/r3 is pending-install (revision 1), a/r4 is pending-install (revision 1), a/r5 is pending-install (revision 1) and 2 more" + tail}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := upgradeableCondition(tc.running, tc.secrets)
			if c.Type != "Upgradeable" {
				t.Errorf("type %q, want Upgradeable", c.Type)
			}
			if diff := cmp.Diff(tc.want, want{c.Status, c.Reason, c.Message}); diff != "" {
				t.Errorf("condition (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNextWrite(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cond := func(s metav1.ConditionStatus, msg string) metav1.Condition {
		return metav1.Condition{Type: "Upgradeable", Status: s, Reason: "R", Message: msg}
	}
	trueC, falseA, falseB := cond(metav1.ConditionTrue, "idle"), cond(metav1.ConditionFalse, "a"), cond(metav1.ConditionFalse, "b")
	type result struct {
		Write bool
		Wait  time.Duration
	}
	tests := []struct {
		name    string
		applied *metav1.Condition
		since   time.Duration // since the last write
		want    metav1.Condition
		result  result
	}{
		{"first report", nil, 0, trueC, result{true, 0}},
		{"unchanged", &trueC, time.Millisecond, trueC, result{false, 0}},
		{"unchanged False", &falseA, time.Hour, falseA, result{false, 0}},
		{"False at once", &trueC, time.Millisecond, falseA, result{true, 0}},
		{"message of False coalesced", &falseA, time.Second, falseB, result{false, upgradeableCoalesce - time.Second}},
		{"message of False after the interval", &falseA, upgradeableCoalesce, falseB, result{true, 0}},
		{"True coalesced", &falseA, 2 * time.Second, trueC, result{false, upgradeableCoalesce - 2*time.Second}},
		{"True after the interval", &falseA, upgradeableCoalesce + time.Second, trueC, result{true, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			write, wait := nextWrite(tc.applied, t0, tc.want, t0.Add(tc.since))
			if diff := cmp.Diff(tc.result, result{write, wait}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// Actions nest (a failed install purges) and each finish is counted once.
func TestRunningActions(t *testing.T) {
	a := newRunningActions()
	install := helmreconciler.HelmAction{Action: "install", Namespace: "a", Release: "chat"}
	other := helmreconciler.HelmAction{Action: "install", Namespace: "a", Release: "other"}
	done1 := a.ActionStarted(install)
	done2 := a.ActionStarted(install)
	done3 := a.ActionStarted(other)
	if got := len(a.list()); got != 2 {
		t.Fatalf("%d running, want 2: %v", got, a.list())
	}
	done1()
	done1() // a second call of the same finish changes nothing
	if diff := cmp.Diff([]helmreconciler.HelmAction{install, other}, a.list(), cmpopts.SortSlices(func(a, b helmreconciler.HelmAction) bool { return a.Release < b.Release })); diff != "" {
		t.Errorf("after one of two installs of chat finished (-want +got):\n%s", diff)
	}
	done2()
	done3()
	if got := a.list(); len(got) != 0 {
		t.Errorf("running after every action finished: %v", got)
	}
	select {
	case <-a.changed:
	default:
		t.Error("no change was signalled")
	}
}
