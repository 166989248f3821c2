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
	sidecarPort   = 9300
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
// the sidecars, the engines' sleep flags, the tier volumes, the node
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
		check("sidecar of "+app, agent, container(t, sts.Spec.Template.Spec, "sidecar").Args)
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
// install), and mounted read-only by exactly the node agent, the
// dispatcher (whose lifecycle leader calls it and the sidecars,
// agentTokenFile) and the sidecar of each sleeping root, by no
// engine container.
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
	for _, app := range []string{"llama", "ollama", "sim", "vllm"} {
		want["StatefulSet/x-"+app+"/sidecar"] = "/etc/orchestra/agent-caller"
	}
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
