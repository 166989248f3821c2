package orchestra

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/plugin"
)

const lifecycleApp = `{gateway: {service: {port: 80}}, applications: {
  chat: {model: {source: "hf://org/chat", file: m.gguf}, lifecycle: {minReplicas: 0, maxReplicas: 3, zeroAfter: 5m}}}}`

// lifecycleRoot is the root StatefulSet of chat as the lifecycle leader
// left it: replicas and the state annotation.
func lifecycleRoot(t *testing.T, replicas, ready int, state string) *unstructured.Unstructured {
	o := sts(t, "demo-chat", "root", "chat", replicas, ready)
	if state != "" {
		o.SetAnnotations(map[string]string{"modelorchestra.io/lifecycle": state})
	}
	return o
}

// TestLifecycleStatusCopiesTheLeadersReport checks that the tier, the
// expected resume time and the last wake's tier, bytes and first token
// reach status.applications.<app>.lifecycle as the leader published them.
func TestLifecycleStatusCopiesTheLeadersReport(t *testing.T) {
	complete := progress(t, "chat", `{"phase":"Complete","bytesDone":1,"bytesTotal":1,"files":1,"filesDone":1,"verified":true}`)
	root := lifecycleRoot(t, 1, 1, `{"state":"Awake","replicas":1,"residentTier":"Accelerator","expectedResumeSeconds":"0","sleeps":4,
		"lastWake":{"trigger":"request","seconds":"0.61","fromTier":"Warm","bytes":1073741824,"bytesPerSecond":2147483648,"firstTokenSeconds":"0.64"}}`)
	res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, lifecycleApp), Objects: append(stack(t, 1), complete, root)})
	if err != nil {
		t.Fatal(err)
	}
	lc, _, _ := unstructured.NestedMap(res.Fields, "applications", "chat", "lifecycle")
	want := map[string]any{
		"state": "Awake", "replicas": float64(1), "residentTier": "Accelerator", "expectedResumeSeconds": "0", "sleeps": float64(4),
		"lastWake": map[string]any{"trigger": "request", "seconds": "0.61", "fromTier": "Warm", "bytes": float64(1 << 30), "bytesPerSecond": float64(2 << 30), "firstTokenSeconds": "0.64"},
	}
	if diff := cmp.Diff(want, lc); diff != "" {
		t.Errorf("lifecycle status (-want +got):\n%s", diff)
	}
}

func TestLifecycleStatus(t *testing.T) {
	complete := progress(t, "chat", `{"phase":"Complete","bytesDone":1,"bytesTotal":1,"files":1,"filesDone":1,"verified":true}`)
	cases := []struct {
		name                         string
		root                         *unstructured.Unstructured
		wantPhase                    v1alpha1.Phase
		wantState                    v1alpha1.LifecycleState
		wantReplicas                 int32
		wantReady, wantTopo          string
		wantAwake, wantTopoReason    string
		wantMessage, wantReadyReason string
	}{
		{
			name:      "at zero the application is idle, and ready",
			root:      lifecycleRoot(t, 0, 0, `{"state":"Zero","replicas":0,"wakes":2}`),
			wantPhase: v1alpha1.PhaseIdle, wantState: v1alpha1.LifecycleZero, wantReplicas: 0,
			wantReady: "True", wantTopo: "True", wantAwake: "0/1", wantTopoReason: v1alpha1.ReasonTopologyAvailable,
			wantMessage: "the next request wakes it",
		},
		{
			name: "parked is idle, ready, and says where the copies are",
			root: lifecycleRoot(t, 0, 0, `{"state":"Zero","replicas":0,"residentTier":"Warm","parked":{"since":"2026-11-28T10:00:00Z",
				"copies":[{"node":"gpu-2","tier":"Warm"}],"nodeLabel":"weights.modelorchestra.io/ns.demo-chat"}}`),
			wantPhase: v1alpha1.PhaseIdle, wantState: v1alpha1.LifecycleZero, wantReplicas: 0,
			wantReady: "True", wantTopo: "True", wantAwake: "0/1", wantTopoReason: v1alpha1.ReasonTopologyAvailable,
			wantMessage: "parked: its pods were scaled away after parkAfter asleep, freeing their accelerators; the node agents keep its weights (Warm on gpu-2); the next request wakes it from zero, preferring those nodes",
		},
		{
			name:      "waking is ready: requests wait in the queue",
			root:      lifecycleRoot(t, 1, 0, `{"state":"Waking","replicas":1}`),
			wantPhase: v1alpha1.PhaseWaking, wantState: v1alpha1.LifecycleWaking, wantReplicas: 1,
			wantReady: "True", wantTopo: "True", wantAwake: "0/1", wantTopoReason: v1alpha1.ReasonTopologyAvailable,
			wantMessage: "waking",
		},
		{
			name:      "a wake that cannot start is not ready and says why",
			root:      lifecycleRoot(t, 1, 0, `{"state":"Waking","replicas":1,"message":"pod demo-chat-0 container engine: ImagePullBackOff"}`),
			wantPhase: v1alpha1.PhaseWaking, wantState: v1alpha1.LifecycleWaking, wantReplicas: 1,
			wantReady: "False", wantTopo: "False", wantAwake: "0/1", wantTopoReason: v1alpha1.ReasonWakeFailing,
			wantMessage: "cannot wake: pod demo-chat-0 container engine: ImagePullBackOff",
		},
		{
			name:      "asleep is ready but not awake, and says where the weights are",
			root:      lifecycleRoot(t, 1, 0, `{"state":"Asleep","replicas":1,"residentTier":"Hot","expectedResumeSeconds":"0.42","sleeps":3}`),
			wantPhase: v1alpha1.PhaseAsleep, wantState: v1alpha1.LifecycleAsleep, wantReplicas: 1,
			wantReady: "True", wantTopo: "True", wantAwake: "0/1", wantTopoReason: v1alpha1.ReasonTopologyAvailable,
			wantMessage: "weights in the Hot tier; the next request wakes them in about 0.42 s",
		},
		{
			name:      "awake with the replicas the lifecycle set, not scaling.replicas",
			root:      lifecycleRoot(t, 3, 3, `{"state":"Awake","replicas":3}`),
			wantPhase: v1alpha1.PhaseReady, wantState: v1alpha1.LifecycleAwake, wantReplicas: 3,
			wantReady: "True", wantTopo: "True", wantAwake: "1/1", wantTopoReason: v1alpha1.ReasonTopologyAvailable,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs := append(stack(t, 1), complete, tc.root)
			res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, lifecycleApp), Objects: objs})
			if err != nil {
				t.Fatal(err)
			}
			apps := res.Fields["applications"].(map[string]any)
			chat := apps["chat"].(map[string]any)
			if got := v1alpha1.Phase(chat["phase"].(string)); got != tc.wantPhase {
				t.Errorf("phase %s, want %s (%v)", got, tc.wantPhase, chat)
			}
			if got := int32(chat["replicas"].(float64)); got != tc.wantReplicas {
				t.Errorf("replicas %d, want %d", got, tc.wantReplicas)
			}
			lc, _ := chat["lifecycle"].(map[string]any)
			if lc == nil || v1alpha1.LifecycleState(lc["state"].(string)) != tc.wantState {
				t.Errorf("lifecycle %v, want state %s", lc, tc.wantState)
			}
			msg, _ := chat["message"].(string)
			if !strings.Contains(msg, tc.wantMessage) {
				t.Errorf("message %q, want it to contain %q", msg, tc.wantMessage)
			}
			if got := res.Fields["awakeApplications"]; got != tc.wantAwake {
				t.Errorf("awakeApplications %v, want %s", got, tc.wantAwake)
			}
			for _, c := range res.Conditions {
				switch c.Type {
				case v1alpha1.ConditionReady:
					if string(c.Status) != tc.wantReady {
						t.Errorf("Ready %s (%s), want %s", c.Status, c.Message, tc.wantReady)
					}
				case v1alpha1.ConditionTopologyReady:
					if string(c.Status) != tc.wantTopo || c.Reason != tc.wantTopoReason {
						t.Errorf("TopologyReady %s/%s (%s), want %s/%s", c.Status, c.Reason, c.Message, tc.wantTopo, tc.wantTopoReason)
					}
				}
			}
		})
	}
}
