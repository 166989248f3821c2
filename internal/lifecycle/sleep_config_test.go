package lifecycle_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecycle"
)

// TestSleepConfigParsesTheChartsShape parses the sleep section as the
// chart renders it (SLEEP-CONTRACT §3) and fills in the defaults.
func TestSleepConfigParsesTheChartsShape(t *testing.T) {
	const rendered = `
lease: demo-dispatcher-lifecycle
apps:
- name: chat
  rootStatefulSet: demo-chat
  minReplicas: 0
  maxReplicas: 1
  zeroAfter: 1h0m0s
  targetQueuePerReplica: 4
  sleep:
    after: 5m0s
    level: 1
    parkAfter: 1h0m0s
    sidecarPort: 9300
    agentSelector: "app.kubernetes.io/instance=demo,app.kubernetes.io/component=checkpoint-agent"
    agentPort: 9301
    modelCheckpoint: demo-chat
    slo: {resumeRamSeconds: 1, resumeNvmeSeconds: 5}
`
	var cfg lifecycle.Config
	if err := yaml.UnmarshalStrict([]byte(rendered), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg = cfg.Defaulted()
	if err := cfg.Validate([]string{"chat"}); err != nil {
		t.Fatalf("the chart's shape is invalid: %v", err)
	}
	want := &lifecycle.SleepConfig{
		After: metav1.Duration{Duration: 5 * time.Minute}, Level: 1, ParkAfter: metav1.Duration{Duration: time.Hour},
		SidecarPort: 9300, Weights: lifecycle.Weights{AgentPort: 9301, ModelCheckpoint: "demo-chat",
			AgentSelector: "app.kubernetes.io/instance=demo,app.kubernetes.io/component=checkpoint-agent"},
		SLO:          lifecycle.SleepSLO{ResumeRAMSeconds: 1, ResumeNVMeSeconds: 5},
		SleepTimeout: metav1.Duration{Duration: 3 * time.Minute}, WakeTimeout: metav1.Duration{Duration: v1alpha1.WakeCallTimeout},
	}
	if d := cmp.Diff(want, cfg.Apps[0].Sleep); d != "" {
		t.Errorf("parsed and defaulted sleep (-want +got):\n%s", d)
	}
	minimal := lifecycle.Config{Lease: "l", Apps: []lifecycle.App{{Name: "chat", RootStatefulSet: "x", MinReplicas: 1,
		Sleep: &lifecycle.SleepConfig{After: metav1.Duration{Duration: time.Minute}}}}}.Defaulted()
	if s := minimal.Apps[0].Sleep; s.Level != 1 || s.SidecarPort != 9300 || s.AgentPort != 9301 || s.SLO.ResumeRAMSeconds != 1 || s.SLO.ResumeNVMeSeconds != 5 {
		t.Errorf("defaults of a minimal sleep section: %+v", s)
	}
}

func TestSleepConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  func(*lifecycle.App)
		want []string // substrings of the error; none: valid
	}{
		{name: "valid"},
		{name: "no sleep", mut: func(a *lifecycle.App) { a.Sleep = nil }},
		{name: "after missing", mut: func(a *lifecycle.App) { a.Sleep.After.Duration = 0 },
			want: []string{"lifecycle.apps[0] (chat): sleep.after must be positive"}},
		{name: "after not below zeroAfter", mut: func(a *lifecycle.App) { a.Sleep.After.Duration = a.ZeroAfter.Duration },
			want: []string{"sleep.after (10m0s) must be shorter than zeroAfter (10m0s)"}},
		{name: "after above zeroAfter is fine with minReplicas 1", mut: func(a *lifecycle.App) { a.MinReplicas = 1; a.Sleep.After.Duration = time.Hour }},
		{name: "level", mut: func(a *lifecycle.App) { a.Sleep.Level = 3 }, want: []string{"sleep.level must be 1 or 2, got 3"}},
		// Parking a level-2 sleeper scales its pods away (minReplicas 0);
		// there is nothing to demote.
		{name: "parkAfter with level 2", mut: func(a *lifecycle.App) { a.Sleep.Level = 2; a.Sleep.ParkAfter.Duration = time.Hour }},
		{name: "nodeLabel", mut: func(a *lifecycle.App) { a.Sleep.NodeLabel = "weights.modelorchestra.io/ns.x-chat" }},
		{name: "nodeLabel not a label key", mut: func(a *lifecycle.App) { a.Sleep.NodeLabel = "weights.modelorchestra.io/" + strings.Repeat("x", 64) },
			want: []string{"sleep.nodeLabel"}},
		{name: "nodeLabel of another prefix", mut: func(a *lifecycle.App) { a.Sleep.NodeLabel = "example.com/weights" },
			want: []string{"must be a label key under weights.modelorchestra.io/"}},
		{name: "ports", mut: func(a *lifecycle.App) { a.Sleep.SidecarPort = 70000; a.Sleep.AgentPort = -1 },
			want: []string{"sleep.sidecarPort must be a port", "sleep.agentPort must be a port"}},
		{name: "selector", mut: func(a *lifecycle.App) { a.Sleep.AgentSelector = "a in (b" }, want: []string{`sleep.agentSelector "a in (b"`}},
		{name: "coldPath without agents", mut: func(a *lifecycle.App) { a.Sleep.AgentSelector = "" }, want: []string{"sleep.coldPath needs agentSelector"}},
		{name: "coldS3 without agents", mut: func(a *lifecycle.App) { a.Sleep.AgentSelector, a.Sleep.ColdPath, a.Sleep.ColdS3 = "", "", "chat" },
			want: []string{"sleep.coldS3 needs agentSelector"}},
		{name: "coldPath and coldS3", mut: func(a *lifecycle.App) { a.Sleep.ColdS3 = "chat" }, want: []string{"coldPath and coldS3 are exclusive"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := lifecycle.App{Name: "chat", RootStatefulSet: "demo-chat", MinReplicas: 0, MaxReplicas: 1,
				ZeroAfter: metav1.Duration{Duration: 10 * time.Minute}, TargetQueuePerReplica: 1,
				Sleep: &lifecycle.SleepConfig{After: metav1.Duration{Duration: time.Minute}, Level: 1, ParkAfter: metav1.Duration{Duration: time.Hour},
					SidecarPort: 9300, Weights: lifecycle.Weights{AgentPort: 9301, AgentSelector: "app=agent", ColdPath: "model.bin"}}}
			if tc.mut != nil {
				tc.mut(&a)
			}
			err := lifecycle.Config{Lease: "l", Apps: []lifecycle.App{a}}.Defaulted().Validate([]string{"chat"})
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("want an error naming %q, got none", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}
