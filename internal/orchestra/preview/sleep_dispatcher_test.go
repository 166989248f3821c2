package preview

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// TestSleepingRootsGetASeat: every root pod of a sleeping application runs
// the sidecar with its engine's flags, restricted, without volumes,
// ready only through the sidecar's /readyz; the engine gets its sleep flags;
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
			seat := container(t, pod, "sidecar")
			// After the sleep level: the release's caller token, which its
			// sleep, wake and restart require.
			want := append([]string{"--role=sidecar", "--engine=" + tc.engine, "--engine-url=http://127.0.0.1:8080", fmt.Sprintf("--addr=:%d", sidecarPort), tc.seatArgs[0], "--caller-token-file=/etc/orchestra/agent-caller/token"}, tc.seatArgs[1:]...)
			if diff := cmp.Diff(want, seat.Args); diff != "" {
				t.Errorf("seat args (-want +got):\n%s", diff)
			}
			if seat.Image != "ghcr.io/model-orchestra/orchestra-agent:v1.0.0" {
				t.Errorf("seat image %s, want global.images.agent", seat.Image)
			}
			if len(seat.Ports) != 1 || seat.Ports[0].Name != "sidecar" || seat.Ports[0].ContainerPort != sidecarPort {
				t.Errorf("seat ports %+v, want sidecar %d", seat.Ports, sidecarPort)
			}
			if p := seat.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" || p.HTTPGet.Port.String() != "sidecar" {
				t.Errorf("seat readiness %+v, want GET /readyz on port sidecar", p)
			}
			if why := restricted(seat); why != "" {
				t.Errorf("the seat is not restricted: %s", why)
			}
			if len(seat.VolumeMounts) != 1 || seat.VolumeMounts[0].Name != "caller-token" || !seat.VolumeMounts[0].ReadOnly {
				t.Errorf("the seat mounts %v; it reads only the caller token", seat.VolumeMounts)
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

// TestSeatPortAdmitsTheDispatcherOnly: the engines' NetworkPolicy lets
// engines reach each other on every port but the sidecar's, and the
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
		{"dispatcher", sidecarPort, true},
		{"dispatcher", 8080, true},
		{"root", sidecarPort, false},
		{"worker", sidecarPort, false},
		{"root", 8080, true},
		{"worker", 6379, true},
		{"root", sidecarPort - 1, true},
		{"root", sidecarPort + 1, true},
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
		SeatPort        int    `json:"sidecarPort"`
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
		"sim":    {After: "5m0s", Level: 1, ParkAfter: "30m0s", SeatPort: sidecarPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-sim", NodeLabel: "weights.modelorchestra.io/ns.x-sim", WarmTier: "Disk", SLO: slo{1, 5}},
		"vllm":   {After: "10m0s", Level: 2, SeatPort: sidecarPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-vllm", NodeLabel: "weights.modelorchestra.io/ns.x-vllm", WarmTier: "Disk", SLO: slo{2, 10}},
		"ollama": {After: "15m0s", Level: 2, SeatPort: sidecarPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-ollama", NodeLabel: "weights.modelorchestra.io/ns.x-ollama", WarmTier: "Disk", SLO: slo{1, 5}},
		"llama":  {After: "5m0s", Level: 1, SeatPort: sidecarPort, AgentSelector: selector, AgentPort: agentPort, ModelCheckpoint: "x-llama", NodeLabel: "weights.modelorchestra.io/ns.x-llama", WarmTier: "Disk", SLO: slo{1, 5}},
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
