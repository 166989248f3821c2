package preview

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/fetch/s3cred"
)

// The chart's side of the checkpoint wiring (docs/checkpoint.md), rendered
// from hand-written values in the shape the values translator writes
// (testdata/chart/sleep.values.yaml): one sleeping application per engine
// that can sleep, and one application that does not sleep.

const (
	sleepValues   = "testdata/chart/sleep.values.yaml"
	sleepS3Values = "testdata/chart/sleep-s3.values.yaml"
	sleepS3Golden = "testdata/chart/sleep-s3.golden.yaml"
	sleepGolden   = "testdata/chart/sleep.golden.yaml"
	seatPort      = 9300
	agentPort     = 9301
	sleepRelease  = "x"
	sleepNS       = "ns"
)

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vals map[string]any
	if err := yaml.Unmarshal(data, &vals); err != nil {
		t.Fatal(err)
	}
	return vals
}

// renderManifest is renderFiles joined in path order, as one manifest.
func renderManifest(t *testing.T, vals map[string]any) string {
	t.Helper()
	return manifestOf(renderFiles(t, vals), ".yaml")
}

// manifestOf joins the rendered files whose path ends with suffix, in path
// order, as one manifest.
func manifestOf(files map[string]string, suffix string) string {
	names := make([]string, 0, len(files))
	for n := range files {
		if strings.HasSuffix(n, suffix) && strings.TrimSpace(files[n]) != "" {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "# Source: %s\n%s\n", n, strings.TrimSpace(files[n]))
	}
	return b.String()
}

// TestSleepGolden pins what the chart renders for sleeping applications:
// the seat sidecars, the engines' sleep flags, the tier volumes, the node
// agent, the ModelCheckpoints, the dispatcher's Role, configuration and
// NetworkPolicies (go test -update refreshes it).
func TestSleepGolden(t *testing.T) {
	checkGolden(t, sleepValues, sleepGolden, renderManifest(t, readValues(t, sleepValues)))
}

// checkGolden compares got, rendered from values, with the golden file
// (written instead with -update).
func checkGolden(t *testing.T, values, golden, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("rendered %s differs from %s (-want +got; go test -update refreshes):\n%s", values, golden, diff)
	}
}

// TestSleepValuesPassTheSchema: the hand-written values are in the shape the
// chart's values.schema.json accepts (the shape the translator must write).
func TestSleepValuesPassTheSchema(t *testing.T) {
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	coalesced, err := chartutil.CoalesceValues(c, readValues(t, sleepValues))
	if err != nil {
		t.Fatal(err)
	}
	if err := chartutil.ValidateAgainstSchema(c, coalesced); err != nil {
		t.Errorf("%s: %v", sleepValues, err)
	}
}

// rendered are the objects of a render, by kind and name.
type rendered map[string]*unstructured.Unstructured

func renderObjects(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	out := rendered{}
	for name, content := range renderFiles(t, vals) {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
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
	}
	return out
}

func (r rendered) get(t *testing.T, kind, name string, into any) {
	t.Helper()
	o, ok := r[kind+"/"+name]
	if !ok {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatalf("%s %s: %v", kind, name, err)
	}
}

func container(t *testing.T, pod corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range pod.Containers {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %s", name)
	return corev1.Container{}
}

func envOf(c corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	return env
}

// restricted reports why a container breaks the restricted Pod Security
// controls that a container can carry, or "".
func restricted(c corev1.Container) string {
	sc := c.SecurityContext
	switch {
	case sc == nil:
		return "no securityContext"
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || (sc.RunAsUser != nil && *sc.RunAsUser == 0):
		return "may run as root"
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		return "allows privilege escalation"
	case sc.Privileged != nil && *sc.Privileged:
		return "privileged"
	case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
		return "does not drop every capability"
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		return "writable root filesystem"
	case sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault:
		return "no RuntimeDefault seccomp profile"
	}
	return ""
}

// TestSleepingRootsGetASeat: every root pod of a sleeping application runs
// the seat sidecar with its engine's flags, restricted, without volumes,
// ready only through the seat's /readyz; the engine gets its sleep flags;
// an application that does not sleep gets none of it.
func TestSleepingRootsGetASeat(t *testing.T) {
	objs := renderObjects(t, readValues(t, sleepValues))
	for _, tc := range []struct {
		app, engine string
		seatArgs    []string
		check       func(t *testing.T, engine corev1.Container, pod corev1.PodSpec)
	}{
		{"sim", "simulator", []string{"--sleep-level=1"}, func(t *testing.T, e corev1.Container, pod corev1.PodSpec) {
			for _, want := range []string{"--enable-sleep-mode", "--hot-dir=/var/run/model-orchestra/hot", "--warm-dir=/var/run/model-orchestra/warm", "--weights-name=x-sim", "--weights-bytes=64MiB"} {
				if !slices.Contains(e.Args, want) {
					t.Errorf("simulator args %v lack %s", e.Args, want)
				}
			}
			hostPaths := map[string]string{}
			for _, v := range pod.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
				}
			}
			want := map[string]string{"hot": "/dev/shm/model-orchestra/ns", "warm": "/var/lib/model-orchestra/warm/ns"}
			if diff := cmp.Diff(want, hostPaths); diff != "" {
				t.Errorf("hostPath volumes (-want +got):\n%s", diff)
			}
			mounts := map[string]corev1.VolumeMount{}
			for _, m := range e.VolumeMounts {
				mounts[m.Name] = m
			}
			if m := mounts["hot"]; m.MountPath != "/var/run/model-orchestra/hot" || m.ReadOnly {
				t.Errorf("hot tier mount %+v, want read-write at /var/run/model-orchestra/hot", m)
			}
			if m := mounts["warm"]; m.MountPath != "/var/run/model-orchestra/warm" || !m.ReadOnly {
				t.Errorf("warm tier mount %+v, want read-only at /var/run/model-orchestra/warm", m)
			}
		}},
		{"vllm", "vllm", []string{"--sleep-level=2"}, func(t *testing.T, e corev1.Container, _ corev1.PodSpec) {
			if !slices.Contains(e.Args, "--enable-sleep-mode") {
				t.Errorf("vLLM args %v lack --enable-sleep-mode", e.Args)
			}
			if v := envOf(e)["VLLM_SERVER_DEV_MODE"]; v != "1" {
				t.Errorf("VLLM_SERVER_DEV_MODE=%q, want 1 (the sleep endpoints are development endpoints)", v)
			}
		}},
		{"ollama", "ollama", []string{"--sleep-level=2", "--model=qwen-small", "--keep-alive=15m0s"}, func(t *testing.T, e corev1.Container, _ corev1.PodSpec) {
			if v := envOf(e)["OLLAMA_KEEP_ALIVE"]; v != "15m0s" {
				t.Errorf("OLLAMA_KEEP_ALIVE=%q, want the policy's 15m0s instead of the pinned -1", v)
			}
		}},
		{"llama", "llamacpp", []string{"--sleep-level=1", "--model=llama"}, func(t *testing.T, e corev1.Container, pod corev1.PodSpec) {
			args := strings.Join(e.Args, " ")
			if !strings.Contains(args, "--models-preset /etc/orchestra/llama/models.ini") || strings.Contains(args, "--model ") || strings.Contains(args, "--alias") {
				t.Errorf("llama-server args %q: want router mode (--models-preset, no --model or --alias)", args)
			}
			var cm corev1.ConfigMap
			objs.get(t, "ConfigMap", "x-llama-llama", &cm)
			want := "version = 1\n[llama]\nmodel = /models/tinyllama.Q4_K_M.gguf\nload-on-startup = true"
			if got := strings.TrimSpace(cm.Data["models.ini"]); got != want {
				t.Errorf("models.ini:\n%s\nwant:\n%s", got, want)
			}
			found := false
			for _, v := range pod.Volumes {
				found = found || (v.ConfigMap != nil && v.ConfigMap.Name == "x-llama-llama")
			}
			if !found {
				t.Error("the preset ConfigMap is not mounted")
			}
		}},
	} {
		t.Run(tc.app, func(t *testing.T) {
			var sts appsv1.StatefulSet
			objs.get(t, "StatefulSet", "x-"+tc.app, &sts)
			pod := sts.Spec.Template.Spec
			seat := container(t, pod, "seat")
			want := append([]string{"--role=seat", "--engine=" + tc.engine, "--engine-url=http://127.0.0.1:8080", fmt.Sprintf("--addr=:%d", seatPort)}, tc.seatArgs...)
			if diff := cmp.Diff(want, seat.Args); diff != "" {
				t.Errorf("seat args (-want +got):\n%s", diff)
			}
			if seat.Image != "ghcr.io/model-orchestra/orchestra-agent:v1.0.0" {
				t.Errorf("seat image %s, want global.images.agent", seat.Image)
			}
			if len(seat.Ports) != 1 || seat.Ports[0].Name != "seat" || seat.Ports[0].ContainerPort != seatPort {
				t.Errorf("seat ports %+v, want seat %d", seat.Ports, seatPort)
			}
			if p := seat.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "seat" {
				t.Errorf("seat readiness %+v, want GET /readyz on port seat", p)
			}
			if why := restricted(seat); why != "" {
				t.Errorf("the seat is not restricted: %s", why)
			}
			if len(seat.VolumeMounts) != 0 {
				t.Errorf("the seat mounts %v; it reads no file", seat.VolumeMounts)
			}
			engine := container(t, pod, "engine")
			if sc := engine.SecurityContext; sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
				t.Errorf("engine securityContext %+v: privilege escalation or capabilities left", sc)
			}
			tc.check(t, engine, pod)
		})
	}
	t.Run("not sleeping", func(t *testing.T) {
		var sts appsv1.StatefulSet
		objs.get(t, "StatefulSet", "x-awake", &sts)
		pod := sts.Spec.Template.Spec
		if len(pod.Containers) != 1 {
			t.Errorf("containers %d, want the engine only", len(pod.Containers))
		}
		for _, v := range pod.Volumes {
			if v.HostPath != nil {
				t.Errorf("volume %s is a hostPath", v.Name)
			}
		}
		if why := restricted(pod.Containers[0]); why != "" {
			t.Errorf("the simulator that does not sleep lost its restricted context: %s", why)
		}
		if slices.Contains(pod.Containers[0].Args, "--enable-sleep-mode") {
			t.Error("an application without sleep runs its engine in sleep mode")
		}
		if _, ok := objs["ModelCheckpoint/x-awake"]; ok {
			t.Error("an application without sleep has a ModelCheckpoint")
		}
	})
}

// TestNoWarmTier: a policy without the warm tier (tiers.warm None) gives the
// simulator neither the warm directory nor its flag, and tells the
// dispatcher's lifecycle leader, which then asks the node agent for no
// warm copy when it demotes the weights.
func TestNoWarmTier(t *testing.T) {
	vals := readValues(t, sleepValues)
	sim := vals["global"].(map[string]any)["applications"].(map[string]any)["sim"].(map[string]any)
	sim["lifecycle"].(map[string]any)["sleep"].(map[string]any)["tiers"].(map[string]any)["warm"] = "None"
	objs := renderObjects(t, vals)
	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-dispatcher", &cm)
	warm := map[string]v1alpha1.WarmTier{}
	for _, a := range loadDispatcherConfig(t, cm).Lifecycle.Apps {
		if a.Sleep != nil {
			warm[a.Name] = a.Sleep.WarmTier
		}
	}
	if warm["sim"] != v1alpha1.WarmTierNone || warm["vllm"] != v1alpha1.WarmTierDisk {
		t.Errorf("the leader's warm tiers %v, want sim None (the policy's) and vllm Disk (the default)", warm)
	}
	var sts appsv1.StatefulSet
	objs.get(t, "StatefulSet", "x-sim", &sts)
	pod := sts.Spec.Template.Spec
	for _, v := range pod.Volumes {
		if v.Name == "warm" {
			t.Errorf("volume warm %+v rendered without a warm tier", v)
		}
	}
	engine := container(t, pod, "engine")
	for _, m := range engine.VolumeMounts {
		if m.Name == "warm" {
			t.Errorf("mount %+v rendered without a warm tier", m)
		}
	}
	for _, a := range engine.Args {
		if strings.HasPrefix(a, "--warm-dir") {
			t.Errorf("flag %s rendered without a warm tier", a)
		}
	}
	if !slices.Contains(engine.Args, "--hot-dir=/var/run/model-orchestra/hot") {
		t.Errorf("args %v lost the hot tier", engine.Args)
	}
}

// TestNodeAgent: the node agent DaemonSet runs orchestra-agent --role=node
// with the values' tiers and budgets, unprivileged, and only the
// dispatcher reaches it; it is rendered only when global.agent.enabled.
func TestNodeAgent(t *testing.T) {
	vals := readValues(t, sleepValues)
	objs := renderObjects(t, vals)
	var ds appsv1.DaemonSet
	objs.get(t, "DaemonSet", "x-agent", &ds)
	pod := ds.Spec.Template.Spec
	if ds.Spec.Template.Labels["app.kubernetes.io/component"] != "checkpoint-agent" || ds.Spec.Template.Labels["app.kubernetes.io/instance"] != sleepRelease {
		t.Errorf("agent pod labels %v: the dispatcher selects instance=%s,component=checkpoint-agent", ds.Spec.Template.Labels, sleepRelease)
	}
	agent := container(t, pod, "agent")
	want := []string{"--role=node", fmt.Sprintf("--addr=:%d", agentPort), "--hot-dir=/var/lib/orchestra-agent/hot", "--warm-dir=/var/lib/orchestra-agent/warm", "--namespace=ns", "--copy-group=64000", "--release=x", "--caller-token-file=/etc/orchestra/agent-caller/token", "--hot-max-bytes=8GiB", "--warm-max-bytes=100GiB", "--measure-bytes=256MiB", "--verify-interval=15m0s"}
	if diff := cmp.Diff(want, agent.Args); diff != "" {
		t.Errorf("agent args (-want +got):\n%s", diff)
	}
	if len(agent.Ports) != 1 || agent.Ports[0].Name != "agent" || agent.Ports[0].ContainerPort != agentPort {
		t.Errorf("agent ports %+v", agent.Ports)
	}
	sc := agent.SecurityContext
	if sc == nil || (sc.Privileged != nil && *sc.Privileged) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("agent securityContext %+v: want unprivileged, no escalation, no capability, read-only root", sc)
	}
	if pod.HostPID || pod.HostNetwork || pod.HostIPC {
		t.Error("the agent shares a host namespace")
	}
	// Its one API call: get its own Node, named by the downward API.
	if pod.ServiceAccountName != "x-agent" || pod.AutomountServiceAccountToken == nil || !*pod.AutomountServiceAccountToken {
		t.Errorf("agent pod: serviceAccountName %q, automount %v; want x-agent with its token, to read its node", pod.ServiceAccountName, pod.AutomountServiceAccountToken)
	}
	if len(agent.Env) != 1 || agent.Env[0].Name != "NODE_NAME" || agent.Env[0].ValueFrom == nil || agent.Env[0].ValueFrom.FieldRef == nil || agent.Env[0].ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("agent env %+v; want NODE_NAME from spec.nodeName", agent.Env)
	}
	// The chart binds the ServiceAccount to nothing: the operator holds no
	// cluster-wide permission, so the cluster administrator grants get on
	// nodes.
	for k, o := range objs {
		if strings.HasPrefix(k, "ClusterRole") {
			t.Errorf("%s rendered: the operator cannot create cluster-scoped RBAC", k)
		}
		if o.GetKind() == "RoleBinding" {
			var rb rbacv1.RoleBinding
			objs.get(t, "RoleBinding", o.GetName(), &rb)
			for _, sub := range rb.Subjects {
				if sub.Name == "x-agent" {
					t.Errorf("RoleBinding %s binds the agent's ServiceAccount", o.GetName())
				}
			}
		}
	}
	// With the runtime version given, the agent has no API access at all.
	over := readValues(t, sleepValues)
	over["agent"] = map[string]any{"runtimeVersion": "containerd://1.7.24"}
	overObjs := renderObjects(t, over)
	var ods appsv1.DaemonSet
	overObjs.get(t, "DaemonSet", "x-agent", &ods)
	if p := ods.Spec.Template.Spec; p.ServiceAccountName != "" || p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken || len(p.Containers[0].Env) != 0 {
		t.Errorf("with runtimeVersion set the agent still has API access: serviceAccountName %q, automount %v, env %+v", p.ServiceAccountName, p.AutomountServiceAccountToken, p.Containers[0].Env)
	}
	if !slices.Contains(ods.Spec.Template.Spec.Containers[0].Args, "--runtime-version=containerd://1.7.24") {
		t.Errorf("agent args %v lack the override", ods.Spec.Template.Spec.Containers[0].Args)
	}
	for _, k := range []string{"ServiceAccount/x-agent"} {
		if _, ok := overObjs[k]; ok {
			t.Errorf("%s rendered with runtimeVersion set", k)
		}
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.Name == "caller-token" {
			continue // TestCallerTokenSecret
		}
		if v.HostPath == nil {
			t.Errorf("agent volume %s is not a hostPath", v.Name)
			continue
		}
		hostPaths[v.Name] = v.HostPath.Path
	}
	if diff := cmp.Diff(map[string]string{"hot": "/dev/shm/model-orchestra", "warm": "/var/lib/model-orchestra/warm"}, hostPaths); diff != "" {
		t.Errorf("agent hostPaths (-want +got):\n%s", diff)
	}

	var np networkingv1.NetworkPolicy
	objs.get(t, "NetworkPolicy", "x-agent", &np)
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 ||
		np.Spec.Ingress[0].From[0].PodSelector.MatchLabels["app.kubernetes.io/component"] != "dispatcher" ||
		len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.String() != "agent" {
		t.Errorf("agent NetworkPolicy ingress %+v: want the dispatcher on port agent only", np.Spec.Ingress)
	}

	vals["global"].(map[string]any)["agent"].(map[string]any)["enabled"] = false
	if _, ok := renderObjects(t, vals)["DaemonSet/x-agent"]; ok {
		t.Error("the agent renders with global.agent.enabled false")
	}
}

// TestSeatPortAdmitsTheDispatcherOnly: the engines' NetworkPolicy lets
// engines reach each other on every port but the seat's, and the
// dispatcher on all.
func TestSeatPortAdmitsTheDispatcherOnly(t *testing.T) {
	objs := renderObjects(t, readValues(t, sleepValues))
	var np networkingv1.NetworkPolicy
	objs.get(t, "NetworkPolicy", "x-engines", &np)
	admits := func(component string, port int32) bool {
		for _, rule := range np.Spec.Ingress {
			peer := false
			for _, f := range rule.From {
				if f.PodSelector == nil {
					continue
				}
				if f.PodSelector.MatchLabels["app.kubernetes.io/component"] == component {
					peer = true
				}
				for _, e := range f.PodSelector.MatchExpressions {
					if e.Key == "app.kubernetes.io/component" && slices.Contains(e.Values, component) {
						peer = true
					}
				}
			}
			if !peer {
				continue
			}
			if len(rule.Ports) == 0 {
				return true
			}
			for _, p := range rule.Ports {
				if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
					continue
				}
				if p.Port == nil {
					return true
				}
				end := p.Port.IntVal
				if p.EndPort != nil {
					end = *p.EndPort
				}
				if port >= p.Port.IntVal && port <= end {
					return true
				}
			}
		}
		return false
	}
	for _, tc := range []struct {
		component string
		port      int32
		want      bool
	}{
		{"dispatcher", seatPort, true},
		{"dispatcher", 8080, true},
		{"root", seatPort, false},
		{"worker", seatPort, false},
		{"root", 8080, true},
		{"worker", 6379, true},
		{"root", seatPort - 1, true},
		{"root", seatPort + 1, true},
	} {
		if got := admits(tc.component, tc.port); got != tc.want {
			t.Errorf("%s pods reach TCP port %d: %v, want %v", tc.component, tc.port, got, tc.want)
		}
	}
}

// TestDispatcherSleepWiring: the dispatcher may report on the sleeping
// applications' ModelCheckpoints (and no other), and its configuration
// carries each one's sleep block in the shape internal/lifecycle reads.
func TestDispatcherSleepWiring(t *testing.T) {
	objs := renderObjects(t, readValues(t, sleepValues))
	sleeping := []string{"x-llama", "x-ollama", "x-sim", "x-vllm"}
	for _, name := range sleeping {
		mc, ok := objs["ModelCheckpoint/"+name]
		if !ok {
			t.Errorf("no ModelCheckpoint %s", name)
			continue
		}
		spec, _, _ := unstructured.NestedStringMap(mc.Object, "spec")
		if want := map[string]string{"orchestra": sleepRelease, "application": strings.TrimPrefix(name, "x-")}; !cmp.Equal(spec, want) {
			t.Errorf("ModelCheckpoint %s spec %v, want %v", name, spec, want)
		}
		if mc.GetAPIVersion() != "modelorchestra.io/v1alpha1" || mc.GetNamespace() != sleepNS {
			t.Errorf("ModelCheckpoint %s is %s in %q", name, mc.GetAPIVersion(), mc.GetNamespace())
		}
	}

	var role rbacv1.Role
	objs.get(t, "Role", "x-dispatcher", &role)
	var status *rbacv1.PolicyRule
	for i, r := range role.Rules {
		if slices.Contains(r.Resources, "modelcheckpoints/status") {
			status = &role.Rules[i]
		}
		if slices.Contains(r.Resources, "modelcheckpoints") && (slices.Contains(r.Verbs, "create") || slices.Contains(r.Verbs, "delete") || len(r.ResourceNames) == 0) {
			t.Errorf("rule %+v: the dispatcher only reads its applications' ModelCheckpoints", r)
		}
	}
	if status == nil {
		t.Fatal("the dispatcher may not write ModelCheckpoint status")
	}
	if !cmp.Equal(status.Verbs, []string{"get", "patch", "update"}) || !cmp.Equal(status.ResourceNames, sleeping) {
		t.Errorf("status rule %+v, want get/patch/update on %v", status, sleeping)
	}

	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-dispatcher", &cm)
	type slo struct {
		ResumeRAMSeconds  int `json:"resumeRamSeconds"`
		ResumeNVMeSeconds int `json:"resumeNvmeSeconds"`
	}
	type sleep struct {
		After           string `json:"after"`
		Level           int    `json:"level"`
		ParkAfter       string `json:"parkAfter,omitempty"`
		SeatPort        int    `json:"seatPort"`
		AgentSelector   string `json:"agentSelector"`
		AgentPort       int    `json:"agentPort"`
		ModelCheckpoint string `json:"modelCheckpoint"`
		NodeLabel       string `json:"nodeLabel"`
		ColdPath        string `json:"coldPath,omitempty"`
		WarmTier        string `json:"warmTier"`
		SLO             slo    `json:"slo"`
	}
	var cfg struct {
		Lifecycle struct {
			Apps []struct {
				Name  string `json:"name"`
				Sleep *sleep `json:"sleep"`
			} `json:"apps"`
		} `json:"lifecycle"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["dispatcher.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	got := map[string]*sleep{}
	for _, a := range cfg.Lifecycle.Apps {
		got[a.Name] = a.Sleep
	}
	selector := "app.kubernetes.io/instance=x,app.kubernetes.io/component=checkpoint-agent"
	want := map[string]*sleep{
		"sim":    {After: "5m0s", Level: 1, ParkAfter: "30m0s", SeatPort: seatPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-sim", NodeLabel: "weights.modelorchestra.io/ns.x-sim", WarmTier: "Disk", SLO: slo{1, 5}},
		"vllm":   {After: "10m0s", Level: 2, SeatPort: seatPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-vllm", NodeLabel: "weights.modelorchestra.io/ns.x-vllm", WarmTier: "Disk", SLO: slo{2, 10}},
		"ollama": {After: "15m0s", Level: 2, SeatPort: seatPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-ollama", NodeLabel: "weights.modelorchestra.io/ns.x-ollama", WarmTier: "Disk", SLO: slo{1, 5}},
		"llama":  {After: "5m0s", Level: 1, SeatPort: seatPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-llama", NodeLabel: "weights.modelorchestra.io/ns.x-llama", WarmTier: "Disk", SLO: slo{1, 5}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("dispatcher lifecycle sleep blocks (-want +got):\n%s", diff)
	}
	// Every key of every block is one the contract names (a misspelt key
	// would be refused by the dispatcher's strict parser).
	var raw struct {
		Lifecycle struct {
			Apps []map[string]any `json:"apps"`
		} `json:"lifecycle"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["dispatcher.yaml"]), &raw); err != nil {
		t.Fatal(err)
	}
	for _, a := range raw.Lifecycle.Apps {
		s, _ := a["sleep"].(map[string]any)
		js, err := yaml.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(js, &sleep{}); err != nil {
			t.Errorf("app %v: sleep block: %v", a["name"], err)
		}
	}
}

var (
	binariesOnce sync.Once
	binariesDir  string
	binariesErr  error
)

// binary builds one of the project's commands once per test run; TestMain
// removes them.
func binary(t *testing.T, name string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds orchestra-agent and orchestra-sim")
	}
	binariesOnce.Do(func() {
		binariesDir, binariesErr = os.MkdirTemp("", "preview-bin-")
		if binariesErr != nil {
			return
		}
		// Static, as in the images (the real-node test packs them).
		cmd := exec.Command("go", "build", "-trimpath", "-o", binariesDir+"/", "../../../cmd/orchestra-agent", "../../../cmd/orchestra-sim")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binariesErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if binariesErr != nil {
		t.Fatal(binariesErr)
	}
	return filepath.Join(binariesDir, name)
}

// TestRenderedAgentAndEngineFlagsParse: the seats', the node agent's and
// the sleeping simulator's rendered flags pass those binaries' own
// --check-config.
func TestRenderedAgentAndEngineFlagsParse(t *testing.T) {
	objs := renderObjects(t, readValues(t, sleepValues))
	agent, sim := binary(t, "orchestra-agent"), binary(t, "orchestra-sim")
	check := func(what, bin string, args []string) {
		t.Helper()
		var stderr bytes.Buffer
		cmd := exec.Command(bin, append(slices.Clone(args), "--check-config")...)
		cmd.Stderr = &stderr
		if out, err := cmd.Output(); err != nil {
			t.Errorf("%s: %s %v refuses its flags: %v\n%s%s", what, filepath.Base(bin), args, err, out, stderr.String())
		}
	}
	for _, app := range []string{"sim", "vllm", "ollama", "llama"} {
		var sts appsv1.StatefulSet
		objs.get(t, "StatefulSet", "x-"+app, &sts)
		check("seat of "+app, agent, container(t, sts.Spec.Template.Spec, "seat").Args)
		if app == "sim" {
			check("simulator", sim, container(t, sts.Spec.Template.Spec, "engine").Args)
		}
	}
	var ds appsv1.DaemonSet
	objs.get(t, "DaemonSet", "x-agent", &ds)
	check("node agent", agent, container(t, ds.Spec.Template.Spec, "agent").Args)
}

// podTemplates are the pod specs of every workload of a render, by kind
// and name.
func podTemplates(t *testing.T, objs rendered) map[string]corev1.PodSpec {
	t.Helper()
	out := map[string]corev1.PodSpec{}
	for key, o := range objs {
		var into any
		switch o.GetKind() {
		case "Deployment":
			into = &appsv1.Deployment{}
		case "StatefulSet":
			into = &appsv1.StatefulSet{}
		case "DaemonSet":
			into = &appsv1.DaemonSet{}
		case "Job":
			into = &batchv1.Job{}
		default:
			continue
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		switch w := into.(type) {
		case *appsv1.Deployment:
			out[key] = w.Spec.Template.Spec
		case *appsv1.StatefulSet:
			out[key] = w.Spec.Template.Spec
		case *appsv1.DaemonSet:
			out[key] = w.Spec.Template.Spec
		case *batchv1.Job:
			out[key] = w.Spec.Template.Spec
		}
	}
	return out
}

// privileges lists what a pod may do beyond an unprivileged container:
// privilege escalation, a privileged container, added capabilities, a host
// namespace, seccomp off.
func privileges(pod corev1.PodSpec) []string {
	var out []string
	if pod.HostPID {
		out = append(out, "hostPID")
	}
	if pod.HostNetwork {
		out = append(out, "hostNetwork")
	}
	if pod.HostIPC {
		out = append(out, "hostIPC")
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			out = append(out, c.Name+": privilege escalation")
		}
		if sc != nil && sc.Privileged != nil && *sc.Privileged {
			out = append(out, c.Name+": privileged")
		}
		if sc != nil && sc.Capabilities != nil {
			for _, a := range sc.Capabilities.Add {
				out = append(out, c.Name+": adds "+string(a))
			}
		}
		if sc != nil && sc.SeccompProfile != nil && sc.SeccompProfile.Type == corev1.SeccompProfileTypeUnconfined {
			out = append(out, c.Name+": seccomp unconfined")
		}
	}
	return out
}

// TestCallerTokenSecret: the release's caller token Secret is rendered
// with the agent, without a token offline (the operator generates it at
// install), and mounted read-only by exactly the node agent and the
// dispatcher (whose lifecycle leader calls it, agentTokenFile), by no
// engine pod.
func TestCallerTokenSecret(t *testing.T) {
	objs := renderObjects(t, readValues(t, sleepValues))
	var sec corev1.Secret
	objs.get(t, "Secret", "x-agent-caller", &sec)
	if len(sec.Data) != 0 || len(sec.StringData) != 0 {
		t.Errorf("offline render of the caller token Secret holds %d keys; want none (a token in a preview would be known to anyone reading it)", len(sec.Data)+len(sec.StringData))
	}
	mounts := map[string]string{}
	for key, pod := range podTemplates(t, objs) {
		for _, v := range pod.Volumes {
			if v.Secret == nil || v.Secret.SecretName != "x-agent-caller" {
				continue
			}
			for _, c := range pod.Containers {
				for _, m := range c.VolumeMounts {
					if m.Name == v.Name {
						if !m.ReadOnly {
							t.Errorf("%s: container %s mounts the caller token writable", key, c.Name)
						}
						mounts[key+"/"+c.Name] = m.MountPath
					}
				}
			}
		}
	}
	want := map[string]string{"DaemonSet/x-agent/agent": "/etc/orchestra/agent-caller", "Deployment/x-dispatcher/dispatcher": "/etc/orchestra/agent-caller"}
	if diff := cmp.Diff(want, mounts); diff != "" {
		t.Errorf("mounts of the caller token (-want +got):\n%s", diff)
	}
	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-dispatcher", &cm)
	if !strings.Contains(cm.Data["dispatcher.yaml"], "agentTokenFile: /etc/orchestra/agent-caller/token") {
		t.Errorf("the dispatcher's lifecycle configuration does not send the caller token:\n%s", cm.Data["dispatcher.yaml"])
	}
}

// TestNoPrivilegeUnlessProcessSnapshots: with tiers.processSnapshots off
// (the default the translator writes), no rendered pod escalates
// privileges, is privileged, adds a capability or shares a host namespace.
// Turned on for one application while the agent image holds no criu (the
// default: agent.criu empty), still none does: the feature cannot work, so
// nothing is granted for it. With agent.criu set, only the node agent
// gains what criu needs (and the snapshot directory and flags), nothing
// else changes, and it is still not a privileged container.
func TestNoPrivilegeUnlessProcessSnapshots(t *testing.T) {
	vals := readValues(t, sleepValues)
	off := podTemplates(t, renderObjects(t, vals))
	if len(off) < 5 {
		t.Fatalf("only %d workloads rendered: %v", len(off), slices.Sorted(maps.Keys(off)))
	}
	for key, pod := range off {
		if p := privileges(pod); len(p) > 0 {
			t.Errorf("%s, process snapshots off: %v", key, p)
		}
	}

	apps := vals["global"].(map[string]any)["applications"].(map[string]any)
	tiers := apps["sim"].(map[string]any)["lifecycle"].(map[string]any)["sleep"].(map[string]any)["tiers"].(map[string]any)
	tiers["processSnapshots"] = true
	for key, pod := range podTemplates(t, renderObjects(t, vals)) {
		if p := privileges(pod); len(p) > 0 {
			t.Errorf("%s, process snapshots on but no criu in the agent image: %v", key, p)
		}
	}
	vals["agent"] = map[string]any{"criu": "/usr/local/sbin/criu"}
	on := podTemplates(t, renderObjects(t, vals))
	for key, pod := range on {
		p := privileges(pod)
		if key != "DaemonSet/x-agent" {
			if len(p) > 0 {
				t.Errorf("%s, process snapshots on: %v; only the node agent may gain privileges", key, p)
			}
			continue
		}
		want := []string{"hostPID", "agent: privilege escalation", "agent: adds CHECKPOINT_RESTORE", "agent: adds SYS_ADMIN", "agent: adds SYS_PTRACE", "agent: seccomp unconfined"}
		if diff := cmp.Diff(want, p); diff != "" {
			t.Errorf("node agent privileges with process snapshots (-want +got):\n%s", diff)
		}
		agent := container(t, pod, "agent")
		if !slices.Contains(agent.Args, "--snapshot-dir=/var/lib/orchestra-agent/snapshots") || !slices.Contains(agent.Args, "--criu=/usr/local/sbin/criu") {
			t.Errorf("agent args %v lack the snapshot directory or the criu binary", agent.Args)
		}
		if sc := agent.SecurityContext; sc.Privileged == nil || *sc.Privileged || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("agent securityContext %+v: want not privileged, every other capability dropped", sc)
		}
		found := false
		for _, v := range pod.Volumes {
			if v.Name == "snapshots" && v.HostPath != nil && v.HostPath.Path == "/var/lib/model-orchestra/snapshots" {
				found = true
			}
		}
		if !found {
			t.Errorf("agent volumes %+v lack the snapshots hostPath", pod.Volumes)
		}
		if pod.ServiceAccountName != "x-agent" {
			t.Errorf("agent serviceAccountName %q; want x-agent, which lists the release's pods", pod.ServiceAccountName)
		}
	}
	// The agent checks that a process to snapshot is one of the release's
	// pods': list on pods in the namespace, nothing else.
	objs := renderObjects(t, vals)
	var role rbacv1.Role
	objs.get(t, "Role", "x-agent", &role)
	if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].Resources, []string{"pods"}) || !slices.Equal(role.Rules[0].Verbs, []string{"list"}) {
		t.Errorf("agent Role rules %+v; want list on pods only", role.Rules)
	}
	var rb rbacv1.RoleBinding
	objs.get(t, "RoleBinding", "x-agent", &rb)
	if rb.RoleRef.Name != "x-agent" || len(rb.Subjects) != 1 || rb.Subjects[0].Name != "x-agent" {
		t.Errorf("agent RoleBinding %+v", rb)
	}
	if _, ok := on["DaemonSet/x-agent"]; !ok {
		t.Error("no node agent rendered with process snapshots on")
	}
}

// TestAgentMountsTheColdTier: an application whose weights the node agent
// can read in the model cache (lifecycle.sleep.coldPath, which the
// operator sets for a simulator loading its weights from a ReadWriteMany
// cache) has that cache mounted read-only into the agent, under the
// application's name in the agent's cold tier, and its coldPath in the
// dispatcher's lifecycle configuration; without one the agent mounts no
// cache.
func TestAgentMountsTheColdTier(t *testing.T) {
	vals := readValues(t, sleepValues)
	var ds appsv1.DaemonSet
	renderObjects(t, vals).get(t, "DaemonSet", "x-agent", &ds)
	for _, a := range ds.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--cold-dir") {
			t.Errorf("agent flag %s without an application's coldPath", a)
		}
	}

	sim := vals["global"].(map[string]any)["applications"].(map[string]any)["sim"].(map[string]any)
	sim["lifecycle"].(map[string]any)["sleep"].(map[string]any)["coldPath"] = "sim/tiny.gguf"
	objs := renderObjects(t, vals)
	objs.get(t, "DaemonSet", "x-agent", &ds)
	pod := ds.Spec.Template.Spec
	agent := container(t, pod, "agent")
	if !slices.Contains(agent.Args, "--cold-dir=/var/lib/orchestra-agent/cold") {
		t.Errorf("agent args %q, want --cold-dir=/var/lib/orchestra-agent/cold", agent.Args)
	}
	want := corev1.VolumeMount{Name: "cold-sim", MountPath: "/var/lib/orchestra-agent/cold/sim", ReadOnly: true}
	if !slices.Contains(agent.VolumeMounts, want) {
		t.Errorf("agent mounts %+v, want %+v", agent.VolumeMounts, want)
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "cold-sim" })
	if i < 0 || pod.Volumes[i].PersistentVolumeClaim == nil || pod.Volumes[i].PersistentVolumeClaim.ClaimName != "x-sim-model" || !pod.Volumes[i].PersistentVolumeClaim.ReadOnly {
		t.Errorf("agent volumes %+v, want cold-sim: claim x-sim-model, read-only", pod.Volumes)
	}
	if why := privileges(pod); len(why) > 0 {
		t.Errorf("the agent with a cold tier gained privileges: %v", why)
	}

	for name, c := range dispatcherColdTiers(t, objs) {
		want := ""
		if name == "sim" {
			want = "sim/tiny.gguf"
		}
		if c.ColdPath != want || c.ColdS3 != "" {
			t.Errorf("dispatcher lifecycle app %s cold tier %+v, want coldPath %q", name, c, want)
		}
	}
}

// TestSleepS3Golden pins what the chart renders for an application whose
// cold tier is S3 (go test -update refreshes it).
func TestSleepS3Golden(t *testing.T) {
	checkGolden(t, sleepS3Values, sleepS3Golden, renderManifest(t, readValues(t, sleepS3Values)))
}

// TestAgentReadsTheS3ColdTier checks what the chart renders for an
// application whose cold tier is S3: the node agent gets the application's S3 source (--cold-s3, named
// for it, with the model's endpoint and region) and its credentials Secret
// mounted read-only and optional, never the secret values and no
// privilege; the model cache is not mounted into it; the leader's
// configuration names the source (coldS3).
func TestAgentReadsTheS3ColdTier(t *testing.T) {
	vals := readValues(t, sleepS3Values)
	objs := renderObjects(t, vals)
	var ds appsv1.DaemonSet
	objs.get(t, "DaemonSet", "x-agent", &ds)
	pod := ds.Spec.Template.Spec
	agent := container(t, pod, "agent")
	wantArg := "--cold-s3=name=sim,url=s3://models/tiny/tiny.gguf,endpoint=http://minio.storage:9000,region=eu-1,credentials=/etc/orchestra-agent/s3/sim"
	if !slices.Contains(agent.Args, wantArg) {
		t.Errorf("agent args %q, want %s", agent.Args, wantArg)
	}
	for _, a := range agent.Args {
		if strings.HasPrefix(a, "--cold-dir") {
			t.Errorf("agent flag %s: an S3 cold tier mounts no model cache", a)
		}
	}
	want := corev1.VolumeMount{Name: "s3-sim", MountPath: "/etc/orchestra-agent/s3/sim", ReadOnly: true}
	if !slices.Contains(agent.VolumeMounts, want) {
		t.Errorf("agent mounts %+v, want %+v", agent.VolumeMounts, want)
	}
	i := slices.IndexFunc(pod.Volumes, func(v corev1.Volume) bool { return v.Name == "s3-sim" })
	if i < 0 || pod.Volumes[i].Secret == nil || pod.Volumes[i].Secret.SecretName != "s3-keys" ||
		pod.Volumes[i].Secret.Optional == nil || !*pod.Volumes[i].Secret.Optional {
		t.Fatalf("agent volumes %+v, want s3-sim: Secret s3-keys, optional", pod.Volumes)
	}
	var keys []string
	for _, it := range pod.Volumes[i].Secret.Items {
		keys = append(keys, it.Key+"→"+it.Path)
	}
	// The agent reads the files the fetcher names (checkpoint.ColdS3Source).
	if want := []string{s3cred.AccessKeyName + "→" + s3cred.AccessKeyName, s3cred.SecretKeyName + "→" + s3cred.SecretKeyName}; !slices.Equal(keys, want) {
		t.Errorf("Secret keys mounted (key→file) %v, want %v: the two the fetcher reads", keys, want)
	}
	for _, e := range agent.Env {
		if strings.HasPrefix(e.Name, "AWS_") || (e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil) {
			t.Errorf("agent env %s: the credentials come from the mounted Secret only", e.Name)
		}
	}
	if len(agent.EnvFrom) > 0 {
		t.Errorf("agent envFrom %+v: the credentials come from the mounted Secret only", agent.EnvFrom)
	}
	if why := privileges(pod); len(why) > 0 {
		t.Errorf("the agent with an S3 cold tier gained privileges: %v", why)
	}

	if c := dispatcherColdTiers(t, objs); len(c) != 1 || c["sim"] != (coldTier{ColdS3: "sim"}) {
		t.Errorf("dispatcher lifecycle cold tiers %+v, want sim with coldS3 sim and no coldPath", c)
	}
}

// coldTier is where the leader's configuration says an application's cold
// copy is.
type coldTier struct {
	ColdPath string `json:"coldPath"`
	ColdS3   string `json:"coldS3"`
}

// dispatcherColdTiers reads the cold tier of each lifecycle application
// from the rendered dispatcher configuration.
func dispatcherColdTiers(t *testing.T, objs rendered) map[string]coldTier {
	t.Helper()
	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-dispatcher", &cm)
	var cfg struct {
		Lifecycle struct {
			Apps []struct {
				Name  string   `json:"name"`
				Sleep coldTier `json:"sleep"`
			} `json:"apps"`
		} `json:"lifecycle"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["dispatcher.yaml"]), &cfg); err != nil {
		t.Fatal(err)
	}
	out := map[string]coldTier{}
	for _, a := range cfg.Lifecycle.Apps {
		out[a.Name] = a.Sleep
	}
	return out
}
