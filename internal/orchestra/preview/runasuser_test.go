package preview

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// TestRuntimeRunAsUserReachesEveryEngineContainer: the vLLM sample runs as
// its upstream image's root user (no user or group set); with
// runtime.runAsUser and runAsGroup in the resource, the root engine, its
// Ray workers and the model wait run as that user and group, not root.
func TestRuntimeRunAsUserReachesEveryEngineContainer(t *testing.T) {
	p := newRenderer(t)
	data, err := os.ReadFile(filepath.Join(samplesDir, "vllm.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type ids struct{ User, Group *int64 }
	users := func(set []string) map[string]ids {
		t.Helper()
		out, err := p.TemplateBytes(context.Background(), data, Options{Set: set})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]ids{}
		objs := decodeDocs(t, "vllm", out)
		for key, o := range objs {
			if c := o.GetLabels()["app.kubernetes.io/component"]; o.GetKind() != "StatefulSet" || c != "root" && c != "worker" {
				continue // not an engine's
			}
			var sts appsv1.StatefulSet
			objs.get(t, "StatefulSet", o.GetName(), &sts)
			pod := sts.Spec.Template.Spec
			for _, c := range append(append([]corev1.Container{}, pod.InitContainers...), pod.Containers...) {
				sc := c.SecurityContext
				if sc == nil {
					t.Fatalf("%s container %s has no security context", key, c.Name)
				}
				if sc.RunAsUser != nil && *sc.RunAsUser != 0 && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
					t.Errorf("%s container %s runs as %d without runAsNonRoot", key, c.Name, *sc.RunAsUser)
				}
				got[o.GetName()+"/"+c.Name] = ids{sc.RunAsUser, sc.RunAsGroup}
			}
		}
		return got
	}
	def := users(nil)
	set := users([]string{"spec.applications.qwen-72b.runtime.runAsUser=1000", "spec.applications.qwen-72b.runtime.runAsGroup=2000"})
	if len(def) == 0 || len(def) != len(set) {
		t.Fatalf("engine containers: %v by default, %v with runAsUser", def, set)
	}
	t.Logf("engine containers: %d", len(def))
	for name := range def {
		if d := cmp.Diff(ids{}, def[name]); d != "" {
			t.Errorf("%s by default (-want the image's user +got):\n%s", name, d)
		}
		if d := cmp.Diff(ids{ptr.To[int64](1000), ptr.To[int64](2000)}, set[name]); d != "" {
			t.Errorf("%s with runtime.runAsUser 1000 and runAsGroup 2000 (-want +got):\n%s", name, d)
		}
	}
}
