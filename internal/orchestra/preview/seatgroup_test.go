package preview

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/lifecycle"
)

// A seat group (docs/checkpoint.md, "Multiplexing") renders one pod per
// group and replica, one engine and one sidecar per application, and
// leads each application's Service to its own engine's port in that pod.

const seatGroupSample = "simulator-seatgroup.yaml"

func TestSeatGroupSampleRendersOnePodForTheGroup(t *testing.T) {
	res := renderSample(t, newRenderer(t), filepath.Join(samplesDir, seatGroupSample))
	objs := rendered{}
	for _, o := range res.Objects {
		objs[o.GetKind()+"/"+o.GetName()] = o
	}
	apps := []string{"alpha", "beta", "gamma"}

	// No root StatefulSet, root Service or PodDisruptionBudget per application.
	for _, app := range apps {
		for _, kind := range []string{"StatefulSet/shared-" + app, "Service/shared-" + app + "-root", "PodDisruptionBudget/shared-" + app} {
			if _, ok := objs[kind]; ok {
				t.Errorf("%s rendered for an application of a seat group", kind)
			}
		}
	}

	var sts appsv1.StatefulSet
	objs.get(t, "StatefulSet", "shared-seat-accel", &sts)
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 1 {
		t.Errorf("group StatefulSet replicas = %v, want 1", sts.Spec.Replicas)
	}
	pod := sts.Spec.Template.Spec
	var names []string
	for _, c := range pod.Containers {
		names = append(names, c.Name)
	}
	want := []string{"engine-alpha", "sidecar-alpha", "engine-beta", "sidecar-beta", "engine-gamma", "sidecar-gamma"}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Fatalf("group pod containers (-want +got):\n%s", diff)
	}

	for i, app := range apps {
		enginePort, sidecarPort := int32(8080+i), int32(9300+i)
		engine := container(t, pod, "engine-"+app)
		if len(engine.Ports) != 1 || engine.Ports[0].ContainerPort != enginePort || engine.Ports[0].Name != fmt.Sprintf("http-%d", i) {
			t.Errorf("%s ports = %+v, want http-%d on %d", engine.Name, engine.Ports, i, enginePort)
		}
		if !slices.Contains(engine.Args, fmt.Sprintf("--addr=:%d", enginePort)) || !slices.Contains(engine.Args, "--model="+app) {
			t.Errorf("%s args %q do not serve %s on %d", engine.Name, engine.Args, app, enginePort)
		}
		if !slices.Contains(engine.Args, "--enable-sleep-mode") || !slices.Contains(engine.Args, "--weights-name=shared-"+app) {
			t.Errorf("%s args %q lack its sleep flags", engine.Name, engine.Args)
		}
		if p := engine.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Port != intstr.FromString(fmt.Sprintf("http-%d", i)) {
			t.Errorf("%s readiness probe %+v does not ask its own port", engine.Name, p)
		}
		mounts := map[string]string{}
		for _, m := range engine.VolumeMounts {
			mounts[m.MountPath] = m.Name
		}
		if mounts["/models"] != "model-"+app || mounts["/tmp"] != "tmp-"+app || mounts["/var/run/model-orchestra/hot"] != "hot" {
			t.Errorf("%s mounts %v, want its own model and tmp volumes and the shared hot tier", engine.Name, mounts)
		}
		// One device for the group: the sample's deviceMemory, 32Mi.
		if mounts["/var/run/model-orchestra/device"] != "device" || !slices.Contains(engine.Args, "--device-file=/var/run/model-orchestra/device/pool") || !slices.Contains(engine.Args, "--device-capacity=33554432") {
			t.Errorf("%s args %q, mounts %v: want the pod's shared device of 32Mi", engine.Name, engine.Args, mounts)
		}

		seat := container(t, pod, "sidecar-"+app)
		if !slices.Contains(seat.Args, fmt.Sprintf("--engine-url=http://127.0.0.1:%d", enginePort)) || !slices.Contains(seat.Args, fmt.Sprintf("--addr=:%d", sidecarPort)) {
			t.Errorf("%s args %q do not drive its engine on %d from %d", seat.Name, seat.Args, enginePort, sidecarPort)
		}
		// A sleeping engine must not make the group's pod unready.
		if p := seat.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
			t.Errorf("%s readiness probe %+v, want GET /healthz", seat.Name, p)
		}
		if why := restricted(seat); why != "" {
			t.Errorf("%s: %s", seat.Name, why)
		}

		// The application's Service selects the group's pods and targets its engine.
		var svc corev1.Service
		objs.get(t, "Service", "shared-"+app, &svc)
		if diff := cmp.Diff(sts.Spec.Template.Labels, svc.Spec.Selector); diff != "" {
			t.Errorf("Service shared-%s selector is not the group pod's labels (-pod +selector):\n%s", app, diff)
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Name != "http" || svc.Spec.Ports[0].TargetPort != intstr.FromString(fmt.Sprintf("http-%d", i)) {
			t.Errorf("Service shared-%s ports = %+v, want http -> http-%d", app, svc.Spec.Ports, i)
		}
	}

	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "device" })
	if i < 0 || pod.Volumes[i].EmptyDir == nil || pod.Volumes[i].EmptyDir.Medium != corev1.StorageMediumMemory {
		t.Errorf("group pod volumes %+v: want the device, a memory-backed emptyDir", pod.Volumes)
	}

	// Only the dispatcher and the node agents (which read the model's
	// files, with the caller token) reach the seats; the engines still
	// reach each other.
	var np networkingv1.NetworkPolicy
	objs.get(t, "NetworkPolicy", "shared-engines", &np)
	if !strings.Contains(fmt.Sprint(np.Spec.PodSelector.MatchExpressions), "seat-group") {
		t.Errorf("NetworkPolicy shared-engines does not select the group's pods: %v", np.Spec.PodSelector)
	}
	for _, rule := range np.Spec.Ingress {
		if len(rule.From) == 1 && rule.From[0].PodSelector != nil && rule.From[0].PodSelector.MatchLabels["app.kubernetes.io/component"] == "checkpoint-agent" {
			continue
		}
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.IntValue() > 9315 || p.EndPort == nil || *p.EndPort < 9300 {
				continue
			}
			t.Errorf("NetworkPolicy shared-engines admits the engines to seat ports %v-%v", p.Port, *p.EndPort)
		}
	}
}

// renderWithCapabilities renders the chart's values for a cluster that
// serves resource.k8s.io (as Helm's default capabilities say) or not.
func renderWithCapabilities(t *testing.T, vals map[string]any, dra bool) (map[string]string, error) {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	if !caps.APIVersions.Has("resource.k8s.io/v1") {
		t.Fatal("Helm's default capabilities lack resource.k8s.io/v1")
	}
	if !dra {
		caps.APIVersions = slices.DeleteFunc(slices.Clone(caps.APIVersions), func(v string) bool {
			return strings.HasPrefix(v, "resource.k8s.io/")
		})
	}
	rv, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: "x", Namespace: "ns", IsInstall: true}, caps)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	return engine.Render(c, rv)
}

func gpuSeatGroupValues(t *testing.T) map[string]any {
	t.Helper()
	app := func(engine string) map[string]any {
		return map[string]any{
			"model":   map[string]any{"source": "hf://Qwen/Qwen2.5-0.5B-Instruct", "format": "safetensors"},
			"runtime": map[string]any{"engine": engine, "workers": 0, "gpu": map[string]any{"count": 1}},
			"serving": map[string]any{"maxConcurrency": 4},
			"scaling": map[string]any{"replicas": 1},
			"lifecycle": map[string]any{
				"minReplicas": 0, "maxReplicas": 1, "zeroAfter": "15m0s", "targetQueuePerReplica": 4, "maxWait": "10m0s", "scaler": "Builtin",
				"sleep": map[string]any{"level": 1, "parkAfter": "", "verifyInterval": "15m0s", "preemption": true,
					"tiers": map[string]any{"hot": "RAM", "warm": "Disk", "cold": "ModelCache"},
					"slo":   map[string]any{"resumeRamSeconds": 1, "resumeNvmeSeconds": 5}},
				"seat": map[string]any{"group": "gpu", "priority": 0, "minResidency": "30s"},
			},
		}
	}
	return map[string]any{
		"global": map[string]any{
			"nats":         map[string]any{"url": "nats://n.ns.svc:4222", "replicas": 1},
			"agent":        map[string]any{"enabled": true, "hotPath": "/dev/shm/model-orchestra", "warmPath": "/var/lib/model-orchestra/warm"},
			"seatGroups":   map[string]any{"gpu": map[string]any{"activeSeats": 1}},
			"applications": map[string]any{"a": app("vllm"), "b": app("vllm")},
		},
		"gateway": map[string]any{"auth": map[string]any{"anonymous": true}},
	}
}

// TestSeatGroupSharesItsGPUThroughOneDRAClaim: where the cluster serves
// resource.k8s.io, a GPU seat group's pod gets one claim that every engine
// references, and none of the gpu-scheduling annotations that would give
// the GPU to one container; elsewhere the render fails and says why.
func TestSeatGroupSharesItsGPUThroughOneDRAClaim(t *testing.T) {
	files, err := renderWithCapabilities(t, gpuSeatGroupValues(t), true)
	if err != nil {
		t.Fatalf("rendering with resource.k8s.io/v1: %v", err)
	}
	out := rendered{}
	for name, content := range files {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		for k, v := range decodeDocs(t, name, content) {
			out[k] = v
		}
	}
	claim, ok := out["ResourceClaimTemplate/x-seat-gpu"]
	if !ok {
		t.Fatal("no ResourceClaimTemplate x-seat-gpu rendered")
	}
	if claim.GetAPIVersion() != "resource.k8s.io/v1" {
		t.Errorf("claim apiVersion %s, want resource.k8s.io/v1", claim.GetAPIVersion())
	}
	var sts appsv1.StatefulSet
	out.get(t, "StatefulSet", "x-seat-gpu", &sts)
	pod := sts.Spec.Template.Spec
	if len(pod.ResourceClaims) != 1 || pod.ResourceClaims[0].ResourceClaimTemplateName == nil || *pod.ResourceClaims[0].ResourceClaimTemplateName != "x-seat-gpu" {
		t.Errorf("pod resourceClaims = %+v, want one from template x-seat-gpu", pod.ResourceClaims)
	}
	for _, c := range pod.Containers {
		if !strings.HasPrefix(c.Name, "engine-") {
			continue
		}
		if len(c.Resources.Claims) != 1 || c.Resources.Claims[0].Name != pod.ResourceClaims[0].Name {
			t.Errorf("%s claims = %+v, want the pod's one claim", c.Name, c.Resources.Claims)
		}
	}
	for k := range sts.Spec.Template.Annotations {
		if strings.HasPrefix(k, "modelorchestra.io/gpu-") {
			t.Errorf("group pod carries %s, which would give the GPU to one container", k)
		}
	}

	_, err = renderWithCapabilities(t, gpuSeatGroupValues(t), false)
	if err == nil || !strings.Contains(err.Error(), "resource.k8s.io") {
		t.Errorf("rendering a GPU seat group without resource.k8s.io: err = %v, want one naming resource.k8s.io", err)
	}
}

func decodeDocs(t *testing.T, name, content string) rendered {
	t.Helper()
	out := rendered{}
	for _, doc := range strings.Split(content, "\n---") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(m) == 0 {
			continue
		}
		o := &unstructured.Unstructured{Object: m}
		out[o.GetKind()+"/"+o.GetName()] = o
	}
	return out
}

// TestSeatGroupSampleConfiguresTheLeader: the dispatcher's lifecycle
// configuration lists the group with its StatefulSet, its seats and each
// application's priority, minimum residency, sleep level and seat port
// (9300 + its index in name order), and leaves the group's applications out
// of lifecycle.apps (nothing scales the group's pod). The dispatcher's Role
// lets the leader annotate the group's StatefulSet, by name, and scale
// nothing.
func TestSeatGroupSampleConfiguresTheLeader(t *testing.T) {
	res := renderSample(t, newRenderer(t), filepath.Join(samplesDir, seatGroupSample))
	objs := rendered{}
	for _, o := range res.Objects {
		objs[o.GetKind()+"/"+o.GetName()] = o
	}
	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "shared-dispatcher", &cm)
	cfg := loadDispatcherConfig(t, cm)
	if cfg.Lifecycle == nil {
		t.Fatal("no lifecycle section: nothing multiplexes the group")
	}
	if len(cfg.Lifecycle.Apps) != 0 {
		t.Errorf("lifecycle.apps = %v, want none (the group's applications are not scaled)", cfg.Lifecycle.Apps)
	}
	// Each member's swaps are reported to the node agent on the group
	// pod's node, under the name its engine gives its weights; a level-1
	// sleep of the simulator leaves them in the hot tier (its own offload).
	member := func(name string, priority, port int32) lifecycle.SeatMember {
		return lifecycle.SeatMember{Name: name, Priority: priority, MinResidency: metav1.Duration{Duration: 10 * time.Second}, SleepLevel: 1, SidecarPort: port,
			Weights: lifecycle.Weights{Level1Tier: v1alpha1.TierHot, AgentSelector: "app.kubernetes.io/instance=shared,app.kubernetes.io/component=checkpoint-agent", AgentPort: 9301, ModelCheckpoint: "shared-" + name}}
	}
	want := []lifecycle.SeatGroup{{Name: "accel", StatefulSet: "shared-seat-accel", Replicas: 1, ActiveSeats: 1,
		Members: []lifecycle.SeatMember{member("alpha", 10, 9300), member("beta", 0, 9301), member("gamma", 0, 9302)}}}
	if diff := cmp.Diff(want, cfg.Lifecycle.SeatGroups); diff != "" {
		t.Errorf("lifecycle.seatGroups (-want +got):\n%s", diff)
	}

	var role rbacv1.Role
	objs.get(t, "Role", "shared-dispatcher", &role)
	var patch []string
	for _, r := range role.Rules {
		if slices.Contains(r.Resources, "statefulsets/scale") {
			t.Errorf("the dispatcher may scale StatefulSets %v; nothing in a seat group is scaled", r.ResourceNames)
		}
		if slices.Contains(r.Resources, "statefulsets") && slices.Contains(r.Verbs, "patch") {
			patch = append(patch, r.ResourceNames...)
		}
	}
	if diff := cmp.Diff([]string{"shared-seat-accel"}, patch); diff != "" {
		t.Errorf("StatefulSets the dispatcher may patch (-want +got):\n%s", diff)
	}
}

// TestSeatGroupOfTwoReplicasRendersTwoPods: spec.seatGroups.<g>.replicas
// is the group StatefulSet's count and the leader's, and a group of more
// than one pod gets a PodDisruptionBudget that keeps all but one through
// voluntary disruptions.
func TestSeatGroupOfTwoReplicasRendersTwoPods(t *testing.T) {
	res := renderSample(t, newRenderer(t), filepath.Join(samplesDir, "simulator-seatgroup-replicas.yaml"))
	objs := rendered{}
	for _, o := range res.Objects {
		objs[o.GetKind()+"/"+o.GetName()] = o
	}
	var sts appsv1.StatefulSet
	objs.get(t, "StatefulSet", "shared2-seat-accel", &sts)
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 2 {
		t.Errorf("group StatefulSet replicas = %v, want 2", sts.Spec.Replicas)
	}
	var pdb policyv1.PodDisruptionBudget
	objs.get(t, "PodDisruptionBudget", "shared2-seat-accel", &pdb)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v, want 1", pdb.Spec.MaxUnavailable)
	}
	if diff := cmp.Diff(sts.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("PodDisruptionBudget selects other pods than the group's (-group +budget):\n%s", diff)
	}

	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "shared2-dispatcher", &cm)
	cfg := loadDispatcherConfig(t, cm)
	if cfg.Lifecycle == nil || len(cfg.Lifecycle.SeatGroups) != 1 || cfg.Lifecycle.SeatGroups[0].Replicas != 2 {
		t.Errorf("the leader's seat groups %+v, want accel with 2 replicas", cfg.Lifecycle)
	}

	one := renderSample(t, newRenderer(t), filepath.Join(samplesDir, seatGroupSample))
	for _, o := range one.Objects {
		if o.GetKind() == "PodDisruptionBudget" && o.GetName() == "shared-seat-accel" {
			t.Error("a PodDisruptionBudget for a group of one pod: it would block every voluntary eviction")
		}
	}
}

// loadDispatcherConfig loads and validates the dispatcher.yaml of a
// rendered ConfigMap as the dispatcher does.
func loadDispatcherConfig(t *testing.T, cm corev1.ConfigMap) dispatch.Config {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dispatcher.yaml")
	if err := os.WriteFile(path, []byte(cm.Data["dispatcher.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := dispatch.Load(path)
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("dispatcher.yaml is refused: %v", err)
	}
	return cfg
}

// TestSeatGroupDeviceMemoryMustBePositive: the chart's schema refuses a
// group device of no bytes (the API server cannot afford a rule on a
// quantity in the seatGroups map), so such a release fails and says why.
func TestSeatGroupDeviceMemoryMustBePositive(t *testing.T) {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		bytes   int64
		wantErr bool
	}{{1 << 30, false}, {0, true}, {-1, true}} {
		vals := gpuSeatGroupValues(t)
		vals["global"].(map[string]any)["seatGroups"] = map[string]any{"gpu": map[string]any{"activeSeats": 1, "deviceMemory": tc.bytes}}
		coalesced, err := chartutil.CoalesceValues(c, vals)
		if err != nil {
			t.Fatal(err)
		}
		err = chartutil.ValidateAgainstSchema(c, coalesced)
		if got := err != nil && strings.Contains(err.Error(), "deviceMemory"); got != tc.wantErr {
			t.Errorf("deviceMemory %d: schema error %v, want one naming deviceMemory: %v", tc.bytes, err, tc.wantErr)
		}
	}
}
