package orchestra

import (
	"context"
	"strings"
	"testing"

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
