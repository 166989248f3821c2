package helmreconciler

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func crWithStatus(status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "a", "generation": int64(2)}}}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func TestStatusKeepsPluginFieldsAndWritesOnlyChanges(t *testing.T) {
	st := statusFrom(crWithStatus(map[string]any{"endpoint": "http://x", "observedGeneration": int64(1)}))
	st.set(TypeDeployed, metav1.ConditionTrue, ReasonInstallSuccessful, "release %s revision %d is deployed", "a", 1)
	st.deployed = &DeployedRelease{Name: "a", Revision: 1, Chart: "small", Version: "0.1.0", Digest: "d"}
	got, changed, err := st.build()
	if err != nil || !changed {
		t.Fatalf("build = changed %v, err %v; want a change", changed, err)
	}
	if got["endpoint"] != "http://x" {
		t.Errorf("a field set by the status plugin in an earlier reconcile was dropped: %v", got)
	}
	if got["observedGeneration"] != int64(2) {
		t.Errorf("observedGeneration = %v, want 2", got["observedGeneration"])
	}
	wantRelease := map[string]any{"name": "a", "revision": int64(1), "chart": "small", "version": "0.1.0", "digest": "d"}
	if diff := cmp.Diff(wantRelease, got["deployedRelease"]); diff != "" {
		t.Errorf("deployedRelease (-want +got):\n%s", diff)
	}

	// The next reconcile computes the same status: nothing to write.
	again := statusFrom(crWithStatus(got))
	again.set(TypeDeployed, metav1.ConditionTrue, ReasonInstallSuccessful, "release %s revision %d is deployed", "a", 1)
	if _, changed, _ := again.build(); changed {
		t.Error("an unchanged status is reported as changed, so every reconcile would write it")
	}

	// The plugin may not take the engine's fields or conditions.
	if err := again.merge(map[string]any{"deployedRelease": 1}, nil); err == nil {
		t.Error("status plugin allowed to set deployedRelease")
	}
	if err := again.merge(nil, []metav1.Condition{{Type: TypeDeployed, Status: metav1.ConditionFalse, Reason: "X"}}); err == nil {
		t.Error("status plugin allowed to set the Deployed condition")
	}
	if err := again.merge(map[string]any{"endpoint": "http://y"}, []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Up"}}); err != nil {
		t.Fatal(err)
	}
	out, changed, _ := again.build()
	if !changed || out["endpoint"] != "http://y" {
		t.Errorf("plugin field update not written: %v", out)
	}
}

// The engine writes its conditions and deployedRelease without going
// through JSON; what it writes and reads must be what encoding/json (and so
// the API server) makes of them, or every reconcile would see a change.
func TestStatusEncodingIsJSONs(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 11, 22, 8, 0, 0, 0, time.FixedZone("x", 3600)))
	conds := []metav1.Condition{
		{Type: TypeDeployed, Status: metav1.ConditionTrue, Reason: "InstallSuccessful", Message: "m", ObservedGeneration: 3, LastTransitionTime: at},
		{Type: TypeReleaseFailed, Status: metav1.ConditionFalse, Reason: "R"}, // generation 0, no time, no message
	}
	b, err := json.Marshal(conds)
	if err != nil {
		t.Fatal(err)
	}
	var viaJSON []any
	if err := json.Unmarshal(b, &viaJSON); err != nil {
		t.Fatal(err)
	}
	viaJSON = numbers(viaJSON).([]any)
	for i, c := range conds {
		if diff := cmp.Diff(viaJSON[i], any(conditionJSON(c))); diff != "" {
			t.Errorf("condition %d (-json +engine):\n%s", i, diff)
		}
	}
	back := conditionsFrom(viaJSON)
	var want []metav1.Condition
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, back); diff != "" {
		t.Errorf("conditions read back (-json +engine):\n%s", diff)
	}
	d := DeployedRelease{Name: "a", Revision: 7, Chart: "c", Version: "1.0.0", Digest: "d"}
	if got := deployedFrom(map[string]any{"name": "a", "revision": int64(7), "chart": "c", "version": "1.0.0", "digest": "d"}); got != d {
		t.Errorf("deployedRelease read back as %+v", got)
	}
}
