package orchestra

import (
	"context"
	"strings"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/plugin"
)

const sleepingApp = `{applications: {
  chat: {model: {source: "hf://org/chat", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {sleepAfter: 2m, zeroAfter: 30m, checkpointPolicy: fast}},
  fixed: {model: {source: "hf://org/chat", file: m.gguf}}}}`

const awakeApp = `{applications: {chat: {model: {source: "hf://org/chat", file: m.gguf}, lifecycle: {zeroAfter: 5m}}}}`

func TestSleepConditions(t *testing.T) {
	fast := func(slo string) PolicyDocuments {
		return PolicyDocuments{types.NamespacedName{Namespace: "ns", Name: "fast"}: policyDoc(t, "fast", "{slo: "+slo+"}")}
	}
	asleep := func(tier, seconds string) map[string]v1alpha1.ApplicationStatus {
		return map[string]v1alpha1.ApplicationStatus{"chat": {Lifecycle: &v1alpha1.LifecycleStatus{
			State: v1alpha1.LifecycleAsleep, ResidentTier: v1alpha1.Tier(tier), ExpectedResumeSeconds: seconds,
		}}}
	}
	type want struct {
		status, reason string // status "" means the condition is absent
		msg            []string
	}
	for _, tc := range []struct {
		name          string
		spec          string
		policies      PolicyDocuments
		apps          map[string]v1alpha1.ApplicationStatus
		old           []metav1.Condition
		policy, slo   want
		wantNoChanges bool
	}{
		{
			name: "hot wake within the SLO", spec: sleepingApp, policies: fast("{}"), apps: asleep("Hot", "0.42"),
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, []string{"fast"}},
			slo:    want{"False", v1alpha1.ReasonResumeWithinSLO, []string{"chat 0.42 s from Hot (SLO 1 s)"}},
		},
		{
			name: "warm wake slower than the default SLO", spec: sleepingApp, policies: fast("{}"), apps: asleep("Warm", "7.5"),
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, nil},
			slo:    want{"True", v1alpha1.ReasonResumeSlowerThanSLO, []string{"chat resumes from the Warm tier in 7.5 s, over its SLO of 5 s"}},
		},
		{
			name: "the policy's SLO counts", spec: sleepingApp, policies: fast("{resumeNvmeSeconds: 10}"), apps: asleep("Warm", "7.5"),
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, nil},
			slo:    want{"False", v1alpha1.ReasonResumeWithinSLO, []string{"(SLO 10 s)"}},
		},
		{
			name: "hot wake slower than the policy's SLO", spec: sleepingApp, policies: fast("{resumeRamSeconds: 2}"), apps: asleep("Hot", "2.01"),
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, nil},
			slo:    want{"True", v1alpha1.ReasonResumeSlowerThanSLO, []string{"chat", "Hot", "2.01 s", "SLO of 2 s"}},
		},
		{
			name: "a missing policy is named; the inline fields still sleep", spec: sleepingApp, policies: PolicyDocuments{}, apps: asleep("Warm", "7.5"),
			policy: want{"False", v1alpha1.ReasonPolicyNotFound, []string{`checkpointPolicy "fast": CheckpointPolicy ns/fast does not exist`, "inline lifecycle fields"}},
			slo:    want{"True", v1alpha1.ReasonResumeSlowerThanSLO, []string{"SLO of 5 s"}},
		},
		{
			name: "no report yet", spec: sleepingApp, policies: fast("{}"), apps: map[string]v1alpha1.ApplicationStatus{},
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, nil},
			slo:    want{"False", v1alpha1.ReasonResumeWithinSLO, []string{"no expected resume time reported yet: chat"}},
		},
		{
			name: "awake: no SLO applies", spec: sleepingApp, policies: fast("{}"), apps: asleep("Accelerator", "0"),
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, nil},
			slo:    want{"False", v1alpha1.ReasonResumeWithinSLO, nil},
		},
		{name: "nothing sleeps, nothing to say", spec: awakeApp, policies: PolicyDocuments{}},
		{
			name: "nothing sleeps any more", spec: awakeApp, policies: PolicyDocuments{},
			old: []metav1.Condition{
				{Type: v1alpha1.ConditionResumeSLOAtRisk, Status: metav1.ConditionTrue},
				{Type: v1alpha1.ConditionCheckpointPolicyResolved, Status: metav1.ConditionFalse},
			},
			policy: want{"True", v1alpha1.ReasonPoliciesResolved, []string{"no application references a CheckpointPolicy"}},
			slo:    want{"False", v1alpha1.ReasonResumeWithinSLO, []string{"no application sleeps"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo, err := Decode(owner(t, tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			conds := sleepConditions(mo, tc.apps, resolvePolicies(context.Background(), tc.policies, mo), nil, tc.old)
			check := func(typ string, w want) {
				c := meta.FindStatusCondition(conds, typ)
				switch {
				case w.status == "" && c != nil:
					t.Errorf("%s is set (%s %s: %s), want it absent", typ, c.Status, c.Reason, c.Message)
				case w.status == "":
				case c == nil:
					t.Errorf("%s is absent, want %s %s", typ, w.status, w.reason)
				case string(c.Status) != w.status || c.Reason != w.reason:
					t.Errorf("%s = %s %s (%s), want %s %s", typ, c.Status, c.Reason, c.Message, w.status, w.reason)
				default:
					for _, m := range w.msg {
						if !strings.Contains(c.Message, m) {
							t.Errorf("%s message %q does not contain %q", typ, c.Message, m)
						}
					}
				}
			}
			check(v1alpha1.ConditionCheckpointPolicyResolved, tc.policy)
			check(v1alpha1.ConditionResumeSLOAtRisk, tc.slo)
		})
	}
}

// TestStatusReportsSleepConditions runs the status plugin: the policy is
// read through its reader, the leader's report comes from the root's
// annotation, and a sleeping application leaves the stack Ready.
func TestStatusReportsSleepConditions(t *testing.T) {
	complete := progress(t, "chat", `{"phase":"Complete","bytesDone":1,"bytesTotal":1,"files":1,"filesDone":1,"verified":true}`)
	completeFixed := progress(t, "fixed", `{"phase":"Complete","bytesDone":1,"bytesTotal":1,"files":1,"filesDone":1,"verified":true}`)
	root := lifecycleRoot(t, 1, 0, `{"state":"Asleep","replicas":1,"residentTier":"Warm","expectedResumeSeconds":"9.25"}`)
	fixed := sts(t, "demo-fixed", "root", "fixed", 1, 1)
	res, err := Status{}.Status(context.Background(), plugin.StatusInput{
		Owner:   owner(t, sleepingApp),
		Objects: append(stack(t, 1), complete, completeFixed, root, fixed),
		Reader: policiesAndSlices{
			PolicyDocuments: PolicyDocuments{types.NamespacedName{Namespace: "ns", Name: "fast"}: policyDoc(t, "fast", "{}")},
			slices: fake.NewClientBuilder().WithObjects(&discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "demo-gateway-x", Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "demo-gateway"}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}},
			}).Build(),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Fields["awakeApplications"]; got != "1/2" {
		t.Errorf("awakeApplications = %v, want 1/2 (chat sleeps)", got)
	}
	if got := res.Fields["phase"]; got != string(v1alpha1.PhaseReady) {
		t.Errorf("phase = %v, want Ready", got)
	}
	for typ, want := range map[string]string{
		v1alpha1.ConditionReady:                    "True",
		v1alpha1.ConditionCheckpointPolicyResolved: "True",
		v1alpha1.ConditionResumeSLOAtRisk:          "True",
	} {
		c := meta.FindStatusCondition(res.Conditions, typ)
		if c == nil || string(c.Status) != want {
			t.Errorf("%s = %+v, want %s", typ, c, want)
			continue
		}
		if c.ObservedGeneration != 3 {
			t.Errorf("%s observedGeneration = %d, want 3", typ, c.ObservedGeneration)
		}
	}
	if c := meta.FindStatusCondition(res.Conditions, v1alpha1.ConditionResumeSLOAtRisk); c != nil && !strings.Contains(c.Message, "chat resumes from the Warm tier in 9.25 s, over its SLO of 5 s") {
		t.Errorf("ResumeSLOAtRisk message %q", c.Message)
	}
}

// policiesAndSlices reads CheckpointPolicies from documents and lists
// EndpointSlices from a fake client.
type policiesAndSlices struct {
	PolicyDocuments
	slices client.Reader
}

func (r policiesAndSlices) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	return r.slices.List(ctx, l, opts...)
}

func TestProcessSnapshotsCondition(t *testing.T) {
	const snapshotting = `{applications: {
  chat: {model: {source: "hf://org/chat", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {sleepAfter: 2m, tiers: {processSnapshots: true}}},
  fixed: {model: {source: "hf://org/chat", file: m.gguf}}}}`
	const fromPolicy = `{applications: {chat: {model: {source: "hf://org/chat", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {sleepAfter: 2m, checkpointPolicy: snap}}}}`
	const offInline = `{applications: {chat: {model: {source: "hf://org/chat", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {sleepAfter: 2m, checkpointPolicy: snap, tiers: {processSnapshots: false}}}}}`
	snap := PolicyDocuments{types.NamespacedName{Namespace: "ns", Name: "snap"}: policyDoc(t, "snap", "{tiers: {processSnapshots: true}}")}
	nodes := func(n ...v1alpha1.CheckpointNode) map[string]*v1alpha1.ModelCheckpoint {
		return map[string]*v1alpha1.ModelCheckpoint{"chat": {Status: v1alpha1.ModelCheckpointStatus{Nodes: n}}}
	}
	criuFails := v1alpha1.CheckpointNode{Node: "n1", ContainerRuntimeVersion: "containerd://1.7.24",
		ProcessSnapshotsReason: "criu: criu check failed (exit status 1): Error (criu/vdso.c:...): Unexpected rt vDSO area bounds"}
	oldRuntime := v1alpha1.CheckpointNode{Node: "n2", ContainerRuntimeVersion: "containerd://1.7.24",
		ProcessSnapshotsReason: "runtime: containerd 1.7.24 does not implement CRI CheckpointContainer (containerd 2.0 does)"}
	able := v1alpha1.CheckpointNode{Node: "n3", ContainerRuntimeVersion: "containerd://2.0.1", ProcessSnapshots: true}
	for _, tc := range []struct {
		name, spec  string
		policies    PolicyDocuments
		checkpoints map[string]*v1alpha1.ModelCheckpoint
		old         []metav1.Condition
		status      string // "" means absent
		reason      string
		msg         []string
	}{
		{name: "off: nothing to say", spec: sleepingApp, policies: PolicyDocuments{}},
		{
			name: "on, no node report yet: unknown", spec: snapshotting,
			status: "Unknown", reason: v1alpha1.ReasonAwaitingNodeReport, msg: []string{"chat"},
		},
		{
			name: "criu check fails: refused naming the node and why", spec: snapshotting, checkpoints: nodes(criuFails, able),
			status: "False", reason: v1alpha1.ReasonProcessSnapshotsUnsupported,
			msg: []string{"chat: node n1 cannot take process snapshots (container runtime containerd://1.7.24)", "vDSO"},
		},
		{
			name: "containerd before 2.0: refused naming its version", spec: snapshotting, checkpoints: nodes(oldRuntime),
			status: "False", reason: v1alpha1.ReasonProcessSnapshotsUnsupported,
			msg: []string{"node n2", "containerd 1.7.24 does not implement CRI CheckpointContainer"},
		},
		{
			name: "a node without a known runtime says so", spec: snapshotting, checkpoints: nodes(v1alpha1.CheckpointNode{Node: "n4", ProcessSnapshotsReason: "runtime: container runtime version unknown"}),
			status: "False", reason: v1alpha1.ReasonProcessSnapshotsUnsupported, msg: []string{"(container runtime unknown)"},
		},
		{
			name: "every node can", spec: snapshotting, checkpoints: nodes(able),
			status: "True", reason: v1alpha1.ReasonProcessSnapshotsSupported, msg: []string{"chat on n3"},
		},
		{
			name: "on through the policy", spec: fromPolicy, policies: snap, checkpoints: nodes(oldRuntime),
			status: "False", reason: v1alpha1.ReasonProcessSnapshotsUnsupported,
		},
		{name: "inline false overrides the policy", spec: offInline, policies: snap, checkpoints: nodes(oldRuntime)},
		{
			name: "turned off after it was on", spec: sleepingApp, policies: PolicyDocuments{},
			old:    []metav1.Condition{{Type: v1alpha1.ConditionProcessSnapshotsSupported, Status: metav1.ConditionFalse}},
			status: "True", reason: v1alpha1.ReasonProcessSnapshotsOff,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo, err := Decode(owner(t, tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			pols := tc.policies
			if pols == nil {
				pols = PolicyDocuments{}
			}
			c := processSnapshotsCondition(mo, resolvePolicies(context.Background(), pols, mo), tc.checkpoints, tc.old)
			switch {
			case tc.status == "" && c != nil:
				t.Fatalf("condition set (%s %s: %s), want it absent", c.Status, c.Reason, c.Message)
			case tc.status == "":
				return
			case c == nil:
				t.Fatalf("condition absent, want %s %s", tc.status, tc.reason)
			case string(c.Status) != tc.status || c.Reason != tc.reason || c.Type != v1alpha1.ConditionProcessSnapshotsSupported:
				t.Fatalf("%s = %s %s (%s), want %s %s", c.Type, c.Status, c.Reason, c.Message, tc.status, tc.reason)
			}
			for _, m := range tc.msg {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not contain %q", c.Message, m)
				}
			}
		})
	}
}
