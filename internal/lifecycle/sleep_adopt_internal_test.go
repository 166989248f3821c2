package lifecycle

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// A new leader taking over engines asleep asks for the copy of their
// model file when falling asleep would have, unless the copy's demotion
// at parkAfter is already due.
func TestAdoptsCopies(t *testing.T) {
	copies := func(mod func(*SleepConfig)) *SleepConfig {
		s := &SleepConfig{Weights: Weights{ModelCopies: true, ColdPath: "chat/model.gguf", AgentSelector: "component=checkpoint-agent"}}
		if mod != nil {
			mod(s)
		}
		return s
	}
	parkAfter := func(d time.Duration) func(*SleepConfig) {
		return func(s *SleepConfig) { s.ParkAfter = metav1.Duration{Duration: d} }
	}
	for _, tc := range []struct {
		name      string
		sleep     *SleepConfig
		asleepFor time.Duration
		want      bool
	}{
		{"model copies, no parkAfter", copies(nil), 24 * time.Hour, true},
		{"before parkAfter", copies(parkAfter(10 * time.Minute)), 9 * time.Minute, true},
		{"at parkAfter: the copy is demoted", copies(parkAfter(10 * time.Minute)), 10 * time.Minute, false},
		{"after parkAfter", copies(parkAfter(10 * time.Minute)), time.Hour, false},
		{"no hot tier: the warm copy", copies(func(s *SleepConfig) { s.HotTier = v1alpha1.HotTierNone }), time.Minute, true},
		{"no tier for a copy", copies(func(s *SleepConfig) { s.HotTier, s.WarmTier = v1alpha1.HotTierNone, v1alpha1.WarmTierNone }), time.Minute, false},
		{"a cache the agent does not mount: through the sidecar", copies(func(s *SleepConfig) { s.ColdPath = "" }), time.Minute, true},
		{"engines that do not load copies", copies(func(s *SleepConfig) { s.ModelCopies = false }), time.Minute, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.sleep.adoptsCopies(tc.asleepFor); got != tc.want {
				t.Errorf("adoptsCopies(%v) = %v, want %v", tc.asleepFor, got, tc.want)
			}
		})
	}
}
