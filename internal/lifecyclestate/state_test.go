package lifecyclestate

import (
	"encoding/json"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// TestTheBucketKeepsTheStatesMomentsToTheNanosecond: the status's JSON
// times are whole seconds; a bucket value carries since and the wake's
// start exactly, and a value without them (an older leader) reads as whole
// seconds.
func TestTheBucketKeepsTheStatesMomentsToTheNanosecond(t *testing.T) {
	since := time.Date(2026, 11, 26, 12, 0, 10, 987654321, time.UTC)
	start := since.Add(-40 * time.Millisecond)
	st := v1alpha1.LifecycleStatus{
		State: v1alpha1.LifecycleAwake, Since: &metav1.Time{Time: since},
		LastWake: &v1alpha1.WakeStatus{StartTime: &metav1.Time{Time: start}, Trigger: "request"},
	}
	b, err := Encode(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Since.Time.Equal(since) || !got.LastWake.StartTime.Time.Equal(start) || got.State != st.State || got.LastWake.Trigger != "request" {
		t.Errorf("decoded since %v, wake start %v, state %s; want %v, %v, Awake", got.Since, got.LastWake.StartTime, got.State, since, start)
	}

	old, err := json.Marshal(st) // what a leader without the exact moments wrote
	if err != nil {
		t.Fatal(err)
	}
	got, err = Decode(old)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Since.Time.Equal(since.Truncate(time.Second)) || !got.LastWake.StartTime.Time.Equal(start.Truncate(time.Second)) {
		t.Errorf("an older value decoded to since %v, wake start %v; want whole seconds", got.Since, got.LastWake.StartTime)
	}
	if _, err := Decode([]byte("{")); err == nil {
		t.Error("a malformed value decoded without an error")
	}
}
