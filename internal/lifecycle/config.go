package lifecycle

import (
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Config is the lifecycle section of the dispatcher's configuration file.
type Config struct {
	// Lease is the name of the coordination.k8s.io Lease that elects the
	// single decision-maker among dispatcher replicas.
	Lease string `json:"lease"`
	// Owner is the resource that events about transitions are recorded on
	// (the ModelOrchestra); without it they are recorded on the root
	// StatefulSet.
	Owner *Owner `json:"owner,omitempty"`
	// Apps are the applications with a lifecycle.
	Apps []App `json:"apps"`
	// Tick paces the backlog scaler and the idle check (default 1s). Wakes
	// do not wait for it: they are driven by the requests themselves.
	Tick metav1.Duration `json:"tick,omitempty"`
	// SeatGroups are the seat groups whose applications the leader swaps
	// in and out of their shared accelerator (seatgroup_leader.go). Their
	// applications are not in Apps: the lifecycle does not scale a group's
	// pods.
	SeatGroups []SeatGroup `json:"seatGroups,omitempty"`
	// AgentTokenFile holds the release's caller token, which the
	// mutating endpoints of the node agents and of the engines' sidecars
	// require (internal/nodeapi); empty: the leader calls them without
	// one.
	AgentTokenFile string `json:"agentTokenFile,omitempty"`
}

// SeatGroup is one seat group: the applications that share one
// accelerator in the pod of StatefulSet, activeSeats of them awake at once.
type SeatGroup struct {
	// Name is the group (spec.seatGroups.<name>).
	Name string `json:"name"`
	// StatefulSet runs the group's pods.
	StatefulSet string `json:"statefulSet"`
	// Replicas is how many pods the StatefulSet runs (the chart writes
	// the count; the lifecycle does not scale a group). The leader runs
	// the policy per pod, <statefulSet>-0 to <statefulSet>-<replicas-1>.
	// Default 1.
	Replicas int32 `json:"replicas,omitempty"`
	// ActiveSeats is how many applications may be awake at once in each
	// pod. Default 1.
	ActiveSeats int32 `json:"activeSeats,omitempty"`
	// Members are the group's applications.
	Members []SeatMember `json:"members"`
}

// MaxSeatGroupReplicas bounds a seat group's pods (the API's bound on
// spec.seatGroups.<group>.replicas).
const MaxSeatGroupReplicas = 8

// SeatMember is one application of a seat group.
type SeatMember struct {
	// Name is the application (the queue's routing key).
	Name string `json:"name"`
	// Priority: higher keeps a seat and gets one first.
	Priority int32 `json:"priority,omitempty"`
	// MinResidency is how long it keeps a seat once woken unless the
	// group is over budget. Default 30s.
	MinResidency metav1.Duration `json:"minResidency,omitempty"`
	// SleepLevel is its engine's sleep level (1 or 2). Default 1.
	SleepLevel int32 `json:"sleepLevel,omitempty"`
	// SleepAfter puts it to sleep, freeing its seat, once it held it idle
	// this long (lifecycle.sleepAfter); 0: it keeps its seat until
	// another application needs it.
	SleepAfter metav1.Duration `json:"sleepAfter,omitempty"`
	// SidecarPort is its sidecar's port in the group's pod.
	SidecarPort int32 `json:"sidecarPort"`
	// Weights: where its weights rest and which node agents copy them,
	// as an application's sleep (SleepConfig); its fields are this
	// object's.
	Weights
}

// sleep is the member's sleep as the leader's reports to the node agents
// and its copy placements read it (reportSleep, reportWake,
// placeCopiesOf); nil without a node agent.
func (m SeatMember) sleep() *SleepConfig {
	if m.AgentSelector == "" {
		return nil
	}
	return &SleepConfig{Level: m.SleepLevel, Weights: m.Weights,
		WakeTimeout: metav1.Duration{Duration: v1alpha1.WakeCallTimeout}}
}

// Owner identifies the resource events are recorded on.
type Owner struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	UID        string `json:"uid"`
}

// App is one application's lifecycle.
type App struct {
	// Name is the application (the queue's routing key).
	Name string `json:"name"`
	// RootStatefulSet runs the application's roots, one pod per replica.
	RootStatefulSet string `json:"rootStatefulSet"`
	// WorkerStatefulSets are the worker StatefulSets, one per possible
	// replica (index = replica); each runs WorkersPerReplica pods while its
	// replica runs.
	WorkerStatefulSets []string `json:"workerStatefulSets,omitempty"`
	WorkersPerReplica  int32    `json:"workersPerReplica,omitempty"`
	// MinReplicas (0: go to zero when idle) and MaxReplicas bound the
	// replica count.
	MinReplicas int32 `json:"minReplicas"`
	MaxReplicas int32 `json:"maxReplicas"`
	// ZeroAfter is the idle time before going to zero.
	ZeroAfter metav1.Duration `json:"zeroAfter"`
	// TargetQueuePerReplica is the number of queued plus in-flight requests
	// one replica should carry.
	TargetQueuePerReplica int32 `json:"targetQueuePerReplica"`
	// Scaler is Builtin (scale 1..N here) or KEDA (a ScaledObject scales
	// the root; here only 0<->1 and the workers follow the root).
	Scaler v1alpha1.LifecycleScaler `json:"scaler,omitempty"`
	// Sleep, when set, puts the engines to sleep when idle instead of
	// (or, with minReplicas 0, before) going to zero (sleep.go).
	Sleep *SleepConfig `json:"sleep,omitempty"`
}

// scaleDownStabilization is how long the backlog must have asked for fewer
// replicas before the scaler removes some: min(zeroAfter, 1m).
func (a App) scaleDownStabilization() time.Duration {
	return min(a.ZeroAfter.Duration, time.Minute)
}

// Defaulted returns c with its unset fields filled in.
func (c Config) Defaulted() Config {
	if c.Tick.Duration == 0 {
		c.Tick.Duration = time.Second
	}
	for i := range c.Apps {
		a := &c.Apps[i]
		if a.Scaler == "" {
			a.Scaler = v1alpha1.ScalerBuiltin
		}
		if a.MaxReplicas == 0 {
			a.MaxReplicas = 1
		}
		if a.TargetQueuePerReplica == 0 {
			a.TargetQueuePerReplica = 1
		}
		a.Sleep = a.Sleep.defaulted()
	}
	for i := range c.SeatGroups {
		g := &c.SeatGroups[i]
		if g.ActiveSeats == 0 {
			g.ActiveSeats = v1alpha1.DefaultActiveSeats
		}
		if g.Replicas == 0 {
			g.Replicas = v1alpha1.DefaultSeatGroupReplicas
		}
		for j := range g.Members {
			m := &g.Members[j]
			if m.MinResidency.Duration == 0 {
				m.MinResidency.Duration = v1alpha1.DefaultSeatMinResidency
			}
			if m.SleepLevel == 0 {
				m.SleepLevel = v1alpha1.DefaultSleepLevel
			}
			m.AgentPort = agentPortOrDefault(m.AgentPort)
		}
	}
	return c
}

// Validate reports every invalid field; appNames are the applications the
// dispatcher serves.
func (c Config) Validate(appNames []string) error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if c.Lease == "" {
		add("lifecycle.lease must be set")
	}
	served := map[string]bool{}
	for _, n := range appNames {
		served[n] = true
	}
	seen := map[string]bool{}
	for i, a := range c.Apps {
		if err := natsqueue.ValidToken(a.Name); err != nil {
			add("lifecycle.apps[%d].name: %w", i, err)
		}
		if !served[a.Name] {
			add("lifecycle.apps[%d]: application %q is not in apps", i, a.Name)
		}
		if seen[a.Name] {
			add("lifecycle.apps[%d]: application %q is listed twice", i, a.Name)
		}
		seen[a.Name] = true
		if a.RootStatefulSet == "" {
			add("lifecycle.apps[%d] (%s): rootStatefulSet must be set", i, a.Name)
		}
		if a.MinReplicas < 0 || a.MaxReplicas < 1 || a.MinReplicas > a.MaxReplicas {
			add("lifecycle.apps[%d] (%s): need 0 <= minReplicas <= maxReplicas and maxReplicas >= 1, got %d and %d", i, a.Name, a.MinReplicas, a.MaxReplicas)
		}
		if a.MinReplicas == 0 && a.ZeroAfter.Duration <= 0 {
			add("lifecycle.apps[%d] (%s): zeroAfter must be positive with minReplicas 0", i, a.Name)
		}
		if a.TargetQueuePerReplica < 1 {
			add("lifecycle.apps[%d] (%s): targetQueuePerReplica must be at least 1", i, a.Name)
		}
		if len(a.WorkerStatefulSets) > 0 && int32(len(a.WorkerStatefulSets)) < a.MaxReplicas {
			add("lifecycle.apps[%d] (%s): %d workerStatefulSets for maxReplicas %d", i, a.Name, len(a.WorkerStatefulSets), a.MaxReplicas)
		}
		if len(a.WorkerStatefulSets) > 0 && a.WorkersPerReplica < 1 {
			add("lifecycle.apps[%d] (%s): workersPerReplica must be at least 1 with workerStatefulSets", i, a.Name)
		}
		switch a.Scaler {
		case v1alpha1.ScalerBuiltin, v1alpha1.ScalerKEDA:
		default:
			add("lifecycle.apps[%d] (%s): scaler must be Builtin or KEDA, got %q", i, a.Name, a.Scaler)
		}
		errs = append(errs, a.Sleep.validate(i, a)...)
	}
	if c.Tick.Duration < 0 {
		add("lifecycle.tick must not be negative")
	}
	groups := map[string]bool{}
	for i, g := range c.SeatGroups {
		if g.Name == "" {
			add("lifecycle.seatGroups[%d]: name must be set", i)
		}
		if groups[g.Name] {
			add("lifecycle.seatGroups[%d]: group %q is listed twice", i, g.Name)
		}
		groups[g.Name] = true
		if g.StatefulSet == "" {
			add("lifecycle.seatGroups[%d] (%s): statefulSet must be set", i, g.Name)
		}
		if g.ActiveSeats < 0 {
			add("lifecycle.seatGroups[%d] (%s): activeSeats must not be negative, got %d", i, g.Name, g.ActiveSeats)
		}
		if g.Replicas < 0 || g.Replicas > MaxSeatGroupReplicas {
			add("lifecycle.seatGroups[%d] (%s): replicas must be between 1 and %d, got %d", i, g.Name, MaxSeatGroupReplicas, g.Replicas)
		}
		if len(g.Members) < 2 {
			add("lifecycle.seatGroups[%d] (%s): a seat group needs at least 2 applications, got %d", i, g.Name, len(g.Members))
		} else if int(max(g.ActiveSeats, 1)) >= len(g.Members) {
			add("lifecycle.seatGroups[%d] (%s): activeSeats %d leaves nothing to multiplex among %d applications", i, g.Name, g.ActiveSeats, len(g.Members))
		}
		for j, m := range g.Members {
			if err := natsqueue.ValidToken(m.Name); err != nil {
				add("lifecycle.seatGroups[%d].members[%d].name: %w", i, j, err)
			}
			if !served[m.Name] {
				add("lifecycle.seatGroups[%d] (%s): application %q is not in apps", i, g.Name, m.Name)
			}
			if seen[m.Name] {
				add("lifecycle.seatGroups[%d] (%s): application %q is listed twice (in lifecycle.apps or another group)", i, g.Name, m.Name)
			}
			seen[m.Name] = true
			if m.SleepLevel != 0 && m.SleepLevel != 1 && m.SleepLevel != 2 {
				add("lifecycle.seatGroups[%d] (%s): application %q: sleepLevel must be 1 or 2, got %d", i, g.Name, m.Name, m.SleepLevel)
			}
			if m.MinResidency.Duration < 0 {
				add("lifecycle.seatGroups[%d] (%s): application %q: minResidency must not be negative", i, g.Name, m.Name)
			}
			if m.SleepAfter.Duration < 0 {
				add("lifecycle.seatGroups[%d] (%s): application %q: sleepAfter must not be negative", i, g.Name, m.Name)
			}
			if m.SidecarPort < 1 || m.SidecarPort > 65535 {
				add("lifecycle.seatGroups[%d] (%s): application %q: sidecarPort must be a port (1-65535), got %d", i, g.Name, m.Name, m.SidecarPort)
			}
			if m.AgentPort < 0 || m.AgentPort > 65535 {
				add("lifecycle.seatGroups[%d] (%s): application %q: agentPort must be a port (1-65535; 0 for the default), got %d", i, g.Name, m.Name, m.AgentPort)
			}
			if m.AgentSelector != "" {
				if _, err := labels.Parse(m.AgentSelector); err != nil {
					add("lifecycle.seatGroups[%d] (%s): application %q: agentSelector %q: %v", i, g.Name, m.Name, m.AgentSelector, err)
				}
				if m.ModelCheckpoint == "" {
					add("lifecycle.seatGroups[%d] (%s): application %q: agentSelector needs modelCheckpoint, the weights' name in the node agent's tiers", i, g.Name, m.Name)
				}
			}
			if m.ColdPath != "" && m.AgentSelector == "" {
				add("lifecycle.seatGroups[%d] (%s): application %q: coldPath needs agentSelector", i, g.Name, m.Name)
			}
			if m.ColdS3 != "" && m.AgentSelector == "" {
				add("lifecycle.seatGroups[%d] (%s): application %q: coldS3 needs agentSelector", i, g.Name, m.Name)
			}
			if m.ModelCopies && m.AgentSelector == "" {
				add("lifecycle.seatGroups[%d] (%s): application %q: modelCopies needs agentSelector: the node agent places the copies", i, g.Name, m.Name)
			}
			if m.HotTier != "" && m.HotTier != v1alpha1.HotTierRAM && m.HotTier != v1alpha1.HotTierNone {
				add("lifecycle.seatGroups[%d] (%s): application %q: hotTier must be RAM or None, got %q", i, g.Name, m.Name, m.HotTier)
			}
			if m.WarmTier != "" && m.WarmTier != v1alpha1.WarmTierDisk && m.WarmTier != v1alpha1.WarmTierNone {
				add("lifecycle.seatGroups[%d] (%s): application %q: warmTier must be Disk or None, got %q", i, g.Name, m.Name, m.WarmTier)
			}
			if m.ColdS3 != "" && m.ColdPath != "" {
				add("lifecycle.seatGroups[%d] (%s): application %q: coldPath and coldS3 are exclusive: the cold tier is the model cache or S3", i, g.Name, m.Name)
			}
		}
	}
	return errors.Join(errs...)
}
