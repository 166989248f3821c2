package lifecycle

import (
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// DefaultAgentPort is the node agent's port when the configuration names
// none.
const DefaultAgentPort = 9301

// agentPortOrDefault is the node agent's port p, or DefaultAgentPort when
// p is 0: the one default of every agentPort (an application's sleep and a
// seat group member's).
func agentPortOrDefault(p int32) int32 {
	if p == 0 {
		return DefaultAgentPort
	}
	return p
}

// DefaultSidecarPort is the per-engine sidecar's port in a root pod when
// the configuration names none (the chart's mo.sidecarPort).
const DefaultSidecarPort = 9300

// SleepConfig is the sleep section of an application's lifecycle: when its
// engines sleep, how, and where the leader finds the sidecars and node agents
// that do it. The chart renders it from the application's effective
// lifecycle (inline fields over its CheckpointPolicy).
type SleepConfig struct {
	// After is the idle time (none queued, none in flight) before the
	// engines are put to sleep. With minReplicas 0 it must be shorter than
	// zeroAfter: the engines sleep first, the pods go later.
	After metav1.Duration `json:"after"`
	// Level is the engines' sleep level: 1 keeps the weights in the node's
	// hot tier (RAM), 2 drops them (a wake reloads them from the warm or
	// cold tier). Default 1.
	Level int32 `json:"level,omitempty"`
	// ParkAfter is how long engines sleep before the application is
	// parked: an engine's own level-1 offload is demoted (the weights leave
	// the hot tier, and the engines sleep at level 2 with the node agent
	// holding the warm copy), then, with minReplicas 0, the pods are
	// scaled to zero while the node agents keep their copies. 0: never.
	ParkAfter metav1.Duration `json:"parkAfter,omitempty"`
	// NodeLabel is the node label the leader keeps on the nodes whose node
	// agent holds a copy of the weights (hot or warm), which the root
	// pods' preferred node affinity names (placement.go). Empty: no
	// labels.
	NodeLabel string `json:"nodeLabel,omitempty"`
	// SidecarPort is the sidecar's port in each root pod. Default 9300.
	SidecarPort int32 `json:"sidecarPort,omitempty"`
	// Weights: where the weights rest and which node agents copy them
	// (shared with a seat group member; its fields are this object's).
	Weights
	// SLO is the resume time the application should meet, per tier.
	SLO SleepSLO `json:"slo,omitempty"`
	// SleepTimeout bounds one sidecar's sleep (its drain included). Default
	// v1alpha1.SleepCallTimeout (3m), longer than the sidecar's own bounds
	// of the drain and the engine's sleep.
	SleepTimeout metav1.Duration `json:"sleepTimeout,omitempty"`
	// WakeTimeout bounds one attempt to wake a sidecar; a failed attempt is
	// retried with backoff while requests wait (each bounded by the
	// gateway's maxWait). Default v1alpha1.WakeCallTimeout (11m): longer
	// than the sidecar's own bound of the engine's wake, so the leader
	// never gives up on a wake the sidecar still runs.
	WakeTimeout metav1.Duration `json:"wakeTimeout,omitempty"`
}

// Weights is what an application's sleep (SleepConfig) and a seat group
// member (SeatMember) share: where a level-1 sleep leaves the weights, and
// where the leader finds the node agents that hold and copy them. Both
// embed it, so its fields are theirs in JSON.
type Weights struct {
	// Level1Tier is where a level-1 sleep leaves the weights the engine's
	// wake reads (orchestra.Level1Tier, resolved by the operator): Hot, or
	// Cold for engines that unload completely (Ollama, llama.cpp). Empty
	// is Hot (a configuration rendered before the field existed).
	Level1Tier v1alpha1.Tier `json:"level1Tier,omitempty"`
	// AgentSelector selects the node agents' pods (one per node). For an
	// application, the agent on a root pod's node reports its tiers and
	// places warm copies; for a seat group member, the leader reports each
	// swap's sleep and wake to the agent on the group pod's node (POST
	// /sleeps, POST /wakes), from which it predicts the next wake and
	// promotes the weights ahead of it. Empty: no node agent (an
	// application's resident tier is then known only from the sleep level;
	// a member's swaps are not reported).
	AgentSelector string `json:"agentSelector,omitempty"`
	// AgentPort is the node agent's port. Default 9301.
	AgentPort int32 `json:"agentPort,omitempty"`
	// ModelCheckpoint is the application's ModelCheckpoint: the name of
	// the weights in the node agent's tiers (under the orchestra's
	// namespace) and the engine's weights name, whose level-1 offload a
	// demotion copies. For an application the leader also writes its
	// status; empty: no status is written.
	ModelCheckpoint string `json:"modelCheckpoint,omitempty"`
	// ColdPath is the weights file inside the node agent's cold tier (its
	// --cold-dir, the model cache), sent with each wake so that the agent
	// can promote from it. A demotion copies the engine's level-1 offload
	// from the agent's hot tier into its warm tier (POST /demote); only
	// when that fails and ColdPath is set does it ask the agent for a warm
	// copy from the cold tier instead. Without either, a demoted engine
	// wakes from the cold tier.
	ColdPath string `json:"coldPath,omitempty"`
	// ColdS3 names the node agent's S3 cold source holding the weights
	// (its --cold-s3, the application's name), when the application's
	// cold tier is S3; it stands for ColdPath (exclusive with it).
	ColdS3 string `json:"coldS3,omitempty"`
	// ModelCopies: the engines load the hottest verified copy of their
	// model on their node (orchestra.ModelCopies: Ollama, llama.cpp,
	// vLLM). The leader asks the node agent of each asleep pod's node for
	// a copy in the hottest tier it uses (HotTier, WarmTier), from the
	// model cache the agent mounts at ColdPath or else through a root's
	// sidecar, and demotes it to warm after ParkAfter (sleep_copies.go);
	// the sidecars point the engines' next wake at it.
	ModelCopies bool `json:"modelCopies,omitempty"`
	// HotTier is the application's tiers.hot, resolved by the operator:
	// empty (RAM), or None when no copy is placed in the hot tier.
	HotTier v1alpha1.HotTier `json:"hotTier,omitempty"`
	// WarmTier is the application's tiers.warm, resolved by the operator:
	// Disk, or None when the engines mount no warm tier. With None a
	// demotion places no warm copy (the engines could not read it) and the
	// demoted weights rest in the hot tier when every node agent holds a
	// copy there, else in the cold tier. Empty is Disk (a configuration
	// rendered before the field existed).
	WarmTier v1alpha1.WarmTier `json:"warmTier,omitempty"`
}

// SleepSLO is the resume time objective, in seconds, per tier.
type SleepSLO struct {
	// ResumeRAMSeconds bounds a wake from the hot tier. Default 1.
	ResumeRAMSeconds int32 `json:"resumeRamSeconds,omitempty"`
	// ResumeNVMeSeconds bounds a wake from the warm tier. Default 5.
	ResumeNVMeSeconds int32 `json:"resumeNvmeSeconds,omitempty"`
}

// defaulted returns s with its unset fields filled in (nil stays nil).
func (s *SleepConfig) defaulted() *SleepConfig {
	if s == nil {
		return nil
	}
	d := *s
	if d.Level == 0 {
		d.Level = v1alpha1.DefaultSleepLevel
	}
	if d.SidecarPort == 0 {
		d.SidecarPort = DefaultSidecarPort
	}
	d.AgentPort = agentPortOrDefault(d.AgentPort)
	if d.SLO.ResumeRAMSeconds == 0 {
		d.SLO.ResumeRAMSeconds = v1alpha1.DefaultResumeRAMSeconds
	}
	if d.SLO.ResumeNVMeSeconds == 0 {
		d.SLO.ResumeNVMeSeconds = v1alpha1.DefaultResumeNVMeSeconds
	}
	if d.SleepTimeout.Duration == 0 {
		d.SleepTimeout.Duration = v1alpha1.SleepCallTimeout
	}
	if d.WakeTimeout.Duration == 0 {
		d.WakeTimeout.Duration = v1alpha1.WakeCallTimeout
	}
	return &d
}

// usesWarm reports whether the engines read the warm tier (tiers.warm is
// not None).
func (s *SleepConfig) usesWarm() bool { return s.WarmTier != v1alpha1.WarmTierNone }

// wakeRecord is the report of a wake of k at to the node agents (POST
// /wakes), with what the application's configuration tells them: where
// its cold copy is and whether it has a warm tier. The caller adds what
// the wake measured.
func (s *SleepConfig) wakeRecord(k nodeapi.Key, at time.Time) nodeapi.WakeRecord {
	return nodeapi.WakeRecord{Key: k, Time: at, ColdPath: s.ColdPath, ColdS3: s.ColdS3, NoWarm: !s.usesWarm()}
}

// validate reports every invalid field of application i's sleep section.
func (s *SleepConfig) validate(i int, a App) []error {
	if s == nil {
		return nil
	}
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("lifecycle.apps[%d] (%s): sleep."+format, append([]any{i, a.Name}, args...)...))
	}
	if s.After.Duration <= 0 {
		add("after must be positive, got %v", s.After.Duration)
	}
	if a.MinReplicas == 0 && s.After.Duration >= a.ZeroAfter.Duration && a.ZeroAfter.Duration > 0 {
		add("after (%v) must be shorter than zeroAfter (%v): the engines sleep first and the pods go to zero later", s.After.Duration, a.ZeroAfter.Duration)
	}
	if s.Level != 1 && s.Level != 2 {
		add("level must be 1 or 2, got %d", s.Level)
	}
	if s.ParkAfter.Duration < 0 {
		add("parkAfter must not be negative, got %v", s.ParkAfter.Duration)
	}
	if s.NodeLabel != "" {
		if errs := validation.IsQualifiedName(s.NodeLabel); len(errs) > 0 || !strings.HasPrefix(s.NodeLabel, v1alpha1.WeightsNodeLabelPrefix) {
			add("nodeLabel %q must be a label key under %s: %s", s.NodeLabel, v1alpha1.WeightsNodeLabelPrefix, strings.Join(errs, "; "))
		}
	}
	for name, p := range map[string]int32{"sidecarPort": s.SidecarPort, "agentPort": s.AgentPort} {
		if p < 1 || p > 65535 {
			add("%s must be a port (1-65535), got %d", name, p)
		}
	}
	if s.AgentSelector != "" {
		if _, err := labels.Parse(s.AgentSelector); err != nil {
			add("agentSelector %q: %v", s.AgentSelector, err)
		}
	}
	if s.WarmTier != "" && s.WarmTier != v1alpha1.WarmTierDisk && s.WarmTier != v1alpha1.WarmTierNone {
		add("warmTier must be Disk or None, got %q", s.WarmTier)
	}
	if s.ColdPath != "" && s.AgentSelector == "" {
		add("coldPath needs agentSelector: the node agent places the warm copy")
	}
	if s.ModelCopies && s.AgentSelector == "" {
		add("modelCopies needs agentSelector: the node agent places the copies")
	}
	if s.HotTier != "" && s.HotTier != v1alpha1.HotTierRAM && s.HotTier != v1alpha1.HotTierNone {
		add("hotTier must be RAM or None, got %q", s.HotTier)
	}
	if s.ColdS3 != "" && s.AgentSelector == "" {
		add("coldS3 needs agentSelector: the node agent places the warm copy")
	}
	if s.ColdS3 != "" && s.ColdPath != "" {
		add("coldPath and coldS3 are exclusive: the cold tier is the model cache or S3")
	}
	if s.SLO.ResumeRAMSeconds < 0 || s.SLO.ResumeNVMeSeconds < 0 {
		add("slo seconds must not be negative")
	}
	if s.SleepTimeout.Duration < 0 || s.WakeTimeout.Duration < 0 {
		add("sleepTimeout and wakeTimeout must not be negative")
	}
	return errs
}
