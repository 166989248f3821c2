package preview

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestAgentFollowsTheSleepingEngines renders the sleep sample with the
// application on tainted GPU nodes: the node agent DaemonSet gets the
// engines' nodeSelector and tolerations, so it runs where they run and can
// reach the tainted nodes; with spec.agent set it takes exactly that.
func TestAgentFollowsTheSleepingEngines(t *testing.T) {
	p := newRenderer(t)
	data, err := os.ReadFile(filepath.Join(samplesDir, "simulator-sleep.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	gpuTaint := map[string]any{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
	agentPod := func(edit func(mo *unstructured.Unstructured)) corev1.PodSpec {
		t.Helper()
		all, err := decode(strings.NewReader(string(data)))
		if err != nil {
			t.Fatal(err)
		}
		objs, ctx, err := p.split(context.Background(), all, Options{})
		if err != nil || len(objs) != 1 {
			t.Fatalf("split: %v (%d)", err, len(objs))
		}
		edit(objs[0])
		res, _, err := p.Render(ctx, objs[0], Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range res.Objects {
			if o.GetKind() == "DaemonSet" && strings.HasSuffix(o.GetName(), "-agent") {
				var ds appsv1.DaemonSet
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &ds); err != nil {
					t.Fatal(err)
				}
				return ds.Spec.Template.Spec
			}
		}
		t.Fatal("no node agent DaemonSet rendered")
		return corev1.PodSpec{}
	}
	tol := []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}

	pod := agentPod(func(mo *unstructured.Unstructured) {
		must(t, unstructured.SetNestedStringMap(mo.Object, map[string]string{"gpu": "l4"}, "spec", "applications", "chat", "runtime", "nodeSelector"))
		must(t, unstructured.SetNestedSlice(mo.Object, []any{gpuTaint}, "spec", "applications", "chat", "runtime", "tolerations"))
	})
	if diff := cmp.Diff(map[string]string{"gpu": "l4"}, pod.NodeSelector); diff != "" {
		t.Errorf("agent nodeSelector (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(tol, pod.Tolerations); diff != "" {
		t.Errorf("agent tolerations (-want +got):\n%s", diff)
	}

	pod = agentPod(func(mo *unstructured.Unstructured) {
		must(t, unstructured.SetNestedStringMap(mo.Object, map[string]string{"gpu": "l4"}, "spec", "applications", "chat", "runtime", "nodeSelector"))
		must(t, unstructured.SetNestedSlice(mo.Object, []any{map[string]any{"operator": "Exists"}}, "spec", "agent", "tolerations"))
	})
	if len(pod.NodeSelector) != 0 || len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
		t.Errorf("with spec.agent.tolerations the agent has nodeSelector %v, tolerations %+v; want exactly spec.agent's", pod.NodeSelector, pod.Tolerations)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
