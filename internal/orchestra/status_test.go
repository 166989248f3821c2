package orchestra

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/plugin"
)

const twoApps = `{gateway: {service: {port: 80}}, applications: {
  chat: {model: {source: "hf://org/chat", file: m.gguf}, scaling: {replicas: 2}},
  big: {model: {source: "hf://org/big", format: safetensors, cache: {accessMode: ReadWriteMany}}, runtime: {engine: vllm, workers: 1}}}}`

// live builds a live object of the release with the chart's labels.
func live(t *testing.T, kind, name, component, app, extra string) *unstructured.Unstructured {
	t.Helper()
	apiVersion := map[string]string{"StatefulSet": "apps/v1", "Deployment": "apps/v1", "Job": "batch/v1", "ConfigMap": "v1", "Service": "v1"}[kind]
	labels := "app.kubernetes.io/component: " + component
	if app != "" {
		labels += ", modelorchestra.io/application: " + app
	}
	return fromYAML(t, "apiVersion: "+apiVersion+"\nkind: "+kind+"\nmetadata: {name: "+name+", namespace: ns, generation: 1, labels: {"+labels+"}}\n"+extra)
}

func progress(t *testing.T, app, doc string) *unstructured.Unstructured {
	return live(t, "ConfigMap", "demo-"+app+"-model-progress", "model-progress", app, "data:\n  progress.json: '"+doc+"'\n")
}

func sts(t *testing.T, name, component, app string, replicas, ready int) *unstructured.Unstructured {
	return live(t, "StatefulSet", name, component, app,
		"spec: {replicas: "+itoa(replicas)+"}\nstatus: {observedGeneration: 1, replicas: "+itoa(replicas)+", readyReplicas: "+itoa(ready)+", updatedReplicas: "+itoa(replicas)+"}\n")
}

func deploy(t *testing.T, name, component string, ready int) *unstructured.Unstructured {
	return live(t, "Deployment", name, component, "", "status: {readyReplicas: "+itoa(ready)+"}\n")
}

func itoa(i int) string { return string(rune('0' + i)) }

func stack(t *testing.T, gatewayReady int) []*unstructured.Unstructured {
	return []*unstructured.Unstructured{
		deploy(t, "demo-gateway", "gateway", gatewayReady),
		deploy(t, "demo-dispatcher", "dispatcher", 1),
		sts(t, "demo-nats", "nats", "", 1, 1),
	}
}

func TestStatus(t *testing.T) {
	complete := `{"phase":"Complete","bytesDone":1000,"bytesTotal":1000,"files":2,"filesDone":2,"verified":true}`
	cases := []struct {
		name      string
		objs      func(t *testing.T) []*unstructured.Unstructured
		wantPhase string
		wantApps  map[string]v1alpha1.ApplicationStatus
		wantConds map[string]metav1.ConditionStatus
	}{
		{
			name: "downloading",
			objs: func(t *testing.T) []*unstructured.Unstructured {
				return append(stack(t, 1),
					progress(t, "chat", `{"phase":"Downloading","bytesDone":250,"bytesTotal":1000,"files":4,"filesDone":1,"etaSeconds":30}`),
					sts(t, "demo-chat", "root", "chat", 2, 0))
			},
			wantPhase: "Downloading",
			wantApps: map[string]v1alpha1.ApplicationStatus{
				"chat": {Phase: v1alpha1.PhaseDownloading, ServedModelName: "chat", Replicas: 2,
					Model: v1alpha1.ModelStatus{Phase: "Downloading", Bytes: 250, BytesTotal: 1000, Files: 1, FilesTotal: 4, ProgressPercent: 25, ETASeconds: 30}},
				"big": {Phase: v1alpha1.PhasePending, ServedModelName: "big", Replicas: 1, Workers: 1, Model: v1alpha1.ModelStatus{Phase: "Pending"}},
			},
			wantConds: map[string]metav1.ConditionStatus{"ModelReady": "False", "TopologyReady": "False", "GatewayReady": "True", "Ready": "False"},
		},
		{
			name: "a failed fetch Job fails the application",
			objs: func(t *testing.T) []*unstructured.Unstructured {
				return append(stack(t, 1),
					live(t, "Job", "demo-chat-fetch-1", "model-fetch", "chat", "status: {conditions: [{type: Failed, status: 'True', message: BackoffLimitExceeded}]}\n"),
					progress(t, "big", complete))
			},
			wantPhase: "Failed",
			wantConds: map[string]metav1.ConditionStatus{"ModelReady": "False", "Ready": "False"},
		},
		{
			name: "everything serves",
			objs: func(t *testing.T) []*unstructured.Unstructured {
				return append(stack(t, 2),
					progress(t, "chat", complete), progress(t, "big", complete),
					sts(t, "demo-chat", "root", "chat", 2, 2),
					sts(t, "demo-big", "root", "big", 1, 1),
					sts(t, "demo-big-worker-0", "worker", "big", 1, 1))
			},
			wantPhase: "Ready",
			wantApps: map[string]v1alpha1.ApplicationStatus{
				"chat": {Phase: v1alpha1.PhaseReady, ServedModelName: "chat", Replicas: 2, ReadyReplicas: 2,
					Model: v1alpha1.ModelStatus{Phase: "Complete", Bytes: 1000, BytesTotal: 1000, Files: 2, FilesTotal: 2, ProgressPercent: 100, Verified: true}},
				"big": {Phase: v1alpha1.PhaseReady, ServedModelName: "big", Replicas: 1, ReadyReplicas: 1, Workers: 1, ReadyWorkers: 1,
					Model: v1alpha1.ModelStatus{Phase: "Complete", Bytes: 1000, BytesTotal: 1000, Files: 2, FilesTotal: 2, ProgressPercent: 100, Verified: true}},
			},
			wantConds: map[string]metav1.ConditionStatus{"ModelReady": "True", "TopologyReady": "True", "GatewayReady": "True", "Ready": "True"},
		},
		{
			name: "a replica without its workers does not serve",
			objs: func(t *testing.T) []*unstructured.Unstructured {
				return append(stack(t, 1),
					progress(t, "chat", complete), progress(t, "big", complete),
					sts(t, "demo-chat", "root", "chat", 2, 2),
					sts(t, "demo-big", "root", "big", 1, 1),
					sts(t, "demo-big-worker-0", "worker", "big", 1, 0))
			},
			wantPhase: "Degraded",
			wantConds: map[string]metav1.ConditionStatus{"ModelReady": "True", "TopologyReady": "False", "Ready": "False"},
		},
		{
			name: "no gateway replica",
			objs: func(t *testing.T) []*unstructured.Unstructured {
				return append(stack(t, 0),
					progress(t, "chat", complete), progress(t, "big", complete),
					sts(t, "demo-chat", "root", "chat", 2, 2),
					sts(t, "demo-big", "root", "big", 1, 1),
					sts(t, "demo-big-worker-0", "worker", "big", 1, 1))
			},
			wantPhase: "Starting",
			wantConds: map[string]metav1.ConditionStatus{"TopologyReady": "True", "GatewayReady": "False", "Ready": "False"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, twoApps), Objects: tc.objs(t)})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.Fields["phase"]; got != tc.wantPhase {
				t.Errorf("phase = %v, want %s", got, tc.wantPhase)
			}
			if got := res.Fields["endpoint"]; got != "http://demo-gateway.ns.svc:80/v1" {
				t.Errorf("endpoint = %v", got)
			}
			if tc.wantApps != nil {
				want, err := toPlain(tc.wantApps)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, res.Fields["applications"], cmpopts.IgnoreMapEntries(func(k string, _ any) bool { return k == "message" })); diff != "" {
					t.Errorf("applications (-want +got):\n%s", diff)
				}
			}
			got := map[string]metav1.ConditionStatus{}
			for _, c := range res.Conditions {
				got[c.Type] = c.Status
				if c.ObservedGeneration != 3 {
					t.Errorf("condition %s has observedGeneration %d, want 3", c.Type, c.ObservedGeneration)
				}
				if c.Reason == "" || c.Message == "" {
					t.Errorf("condition %s lacks a reason or message: %+v", c.Type, c)
				}
			}
			for typ, want := range tc.wantConds {
				if got[typ] != want {
					t.Errorf("condition %s = %s, want %s", typ, got[typ], want)
				}
			}
		})
	}
}

func TestStatusEndpoint(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{`{gateway: {ingress: {host: llm.example.com, path: /api, tlsSecretName: tls}}, applications: {a: {model: {source: "hf://o/r", file: f}}}}`, "https://llm.example.com/api/v1"},
		{`{gateway: {httpRoute: {parentRefs: [{name: gw}], hostnames: [llm.internal]}}, applications: {a: {model: {source: "hf://o/r", file: f}}}}`, "http://llm.internal/v1"},
		{`{gateway: {service: {port: 8082}}, applications: {a: {model: {source: "hf://o/r", file: f}}}}`, "http://demo-gateway.ns.svc:8082/v1"},
	} {
		res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, tc.spec)})
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Fields["endpoint"]; got != tc.want {
			t.Errorf("spec %s: endpoint = %v, want %s", tc.spec, got, tc.want)
		}
	}
}

func TestStatusGatewayEndpoints(t *testing.T) {
	slice := func(ready bool) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: "demo-gateway-x", Namespace: "ns", Labels: map[string]string{discoveryv1.LabelServiceName: "demo-gateway"}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready}}},
		}
	}
	for _, tc := range []struct {
		name  string
		ready bool
		want  metav1.ConditionStatus
	}{
		{"no ready endpoint", false, metav1.ConditionFalse},
		{"a ready endpoint", true, metav1.ConditionTrue},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gw := deploy(t, "demo-gateway", "gateway", 1)
			gw.SetNamespace("ns")
			reader := fake.NewClientBuilder().WithObjects(slice(tc.ready)).Build()
			res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, twoApps), Objects: append(stack(t, 1)[1:], gw), Reader: reader})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range res.Conditions {
				if c.Type == v1alpha1.ConditionGatewayReady && c.Status != tc.want {
					t.Errorf("GatewayReady = %s (%s), want %s", c.Status, c.Message, tc.want)
				}
			}
		})
	}
}

// The applications of a seat group run in the group's StatefulSet: their
// readiness is its readiness.
func TestStatusOfASeatGroup(t *testing.T) {
	complete := `{"phase":"Complete","bytesDone":1000,"bytesTotal":1000,"files":2,"filesDone":2,"verified":true}`
	spec := `{seatGroups: {g: {}}, applications: {
  a: {model: {source: "hf://org/a", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {seat: {group: g}}},
  b: {model: {source: "hf://org/b", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {seat: {group: g}}}}}`
	group := func(ready int) *unstructured.Unstructured {
		return fromYAML(t, "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: demo-seat-g, namespace: ns, generation: 1, labels: {app.kubernetes.io/component: seat-group, modelorchestra.io/seat-group: g}}\n"+
			"spec: {replicas: 1}\nstatus: {observedGeneration: 1, replicas: 1, readyReplicas: "+itoa(ready)+", updatedReplicas: 1}\n")
	}
	for _, tc := range []struct {
		ready     int
		wantPhase v1alpha1.Phase
	}{{0, v1alpha1.PhaseStarting}, {1, v1alpha1.PhaseReady}} {
		objs := append(stack(t, 1), progress(t, "a", complete), progress(t, "b", complete), group(tc.ready))
		res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, spec), Objects: objs})
		if err != nil {
			t.Fatal(err)
		}
		apps, _ := res.Fields["applications"].(map[string]any)
		for _, app := range []string{"a", "b"} {
			st, _ := apps[app].(map[string]any)
			if st["phase"] != string(tc.wantPhase) || fmt.Sprint(st["readyReplicas"]) != fmt.Sprint(tc.ready) {
				t.Errorf("group pod ready %d: %s has phase %v and readyReplicas %v, want %s and %d", tc.ready, app, st["phase"], st["readyReplicas"], tc.wantPhase, tc.ready)
			}
		}
	}
}

// Each application of a seat group reports its own lifecycle, which the
// leader publishes on the group's StatefulSet under its own annotation:
// the holder is Ready and says it holds the seat; the other is Asleep with
// its swaps.
func TestStatusOfASeatGroupReportsEachApplicationsSeat(t *testing.T) {
	complete := `{"phase":"Complete","bytesDone":1000,"bytesTotal":1000,"files":2,"filesDone":2,"verified":true}`
	spec := `{seatGroups: {g: {}}, applications: {
  a: {model: {source: "hf://org/a", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {seat: {group: g}}},
  b: {model: {source: "hf://org/b", file: m.gguf}, runtime: {engine: simulator}, lifecycle: {seat: {group: g}}}}}`
	group := fromYAML(t, "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: demo-seat-g, namespace: ns, generation: 1, labels: {app.kubernetes.io/component: seat-group, modelorchestra.io/seat-group: g},\n"+
		"  annotations: {modelorchestra.io/lifecycle.a: '{\"state\":\"Awake\",\"replicas\":1,\"residentTier\":\"Accelerator\",\"seat\":{\"holding\":true,\"swapsIn\":3,\"lastSwapSeconds\":\"0.412\"}}',\n"+
		"    modelorchestra.io/lifecycle.b: '{\"state\":\"Asleep\",\"replicas\":1,\"residentTier\":\"Hot\",\"seat\":{\"swapsIn\":2,\"lastSwapSeconds\":\"0.398\",\"waitingSeconds\":\"1.5\"}}'}}\n"+
		"spec: {replicas: 1}\nstatus: {observedGeneration: 1, replicas: 1, readyReplicas: 1, updatedReplicas: 1}\n")
	objs := append(stack(t, 1), progress(t, "a", complete), progress(t, "b", complete), group)
	res, err := Status{}.Status(context.Background(), plugin.StatusInput{Owner: owner(t, spec), Objects: objs})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		app       string
		wantPhase v1alpha1.Phase
		wantSeat  map[string]any
	}{
		{"a", v1alpha1.PhaseReady, map[string]any{"holding": true, "swapsIn": float64(3), "lastSwapSeconds": "0.412"}},
		{"b", v1alpha1.PhaseAsleep, map[string]any{"swapsIn": float64(2), "lastSwapSeconds": "0.398", "waitingSeconds": "1.5"}},
	} {
		phase, _, _ := unstructured.NestedString(res.Fields, "applications", tc.app, "phase")
		seat, _, _ := unstructured.NestedMap(res.Fields, "applications", tc.app, "lifecycle", "seat")
		if phase != string(tc.wantPhase) {
			t.Errorf("%s: phase %s, want %s", tc.app, phase, tc.wantPhase)
		}
		if diff := cmp.Diff(tc.wantSeat, seat); diff != "" {
			t.Errorf("%s: lifecycle.seat (-want +got):\n%s", tc.app, diff)
		}
	}
}
