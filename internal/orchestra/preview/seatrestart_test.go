package preview

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	psapi "k8s.io/pod-security-admission/api"
	pspolicy "k8s.io/pod-security-admission/policy"
)

// The chart's side of restarting one engine of a seat-group pod and of
// reading its device memory (docs/checkpoint.md, "Restarting one engine of
// a group pod").

const (
	seatEnginesValues = "testdata/chart/seatgroup-engines.values.yaml"
	seatEnginesGolden = "testdata/chart/seatgroup-engines.golden.yaml"
)

// renderSeatEngines renders the vLLM, Ollama and llama.cpp seat group's
// objects on a cluster serving resource.k8s.io/v1.
func renderSeatEngines(t *testing.T) string {
	t.Helper()
	files, err := renderWithCapabilities(t, readValues(t, seatEnginesValues), true)
	if err != nil {
		t.Fatal(err)
	}
	return manifestOf(files, "seatgroup.yaml")
}

// TestSeatGroupEnginesGolden pins the group pod of a vLLM, an Ollama and a
// llama.cpp application sharing one GPU (go test -update refreshes it).
func TestSeatGroupEnginesGolden(t *testing.T) {
	checkGolden(t, seatEnginesValues, seatEnginesGolden, renderSeatEngines(t))
}

// simSeatGroupPod renders the simulator seat-group sample's pod.
func simSeatGroupPod(t *testing.T) corev1.PodSpec {
	t.Helper()
	res := renderSample(t, newRenderer(t), filepath.Join(samplesDir, seatGroupSample))
	objs := rendered{}
	for _, o := range res.Objects {
		objs[o.GetKind()+"/"+o.GetName()] = o
	}
	var sts appsv1.StatefulSet
	objs.get(t, "StatefulSet", "shared-seat-accel", &sts)
	return sts.Spec.Template.Spec
}

// TestSeatGroupSidecarsCanRestartTheirEngines: the group pod shares its
// process namespace; the sidecar of each engine that cannot restart itself is
// told to restart it through its processes and runs as the engine's user
// and group (Ollama's 65532; root, the upstream vLLM and llama.cpp images'
// user) with no capability and no privilege escalation;
// on a GPU every seat reads nvidia-smi and holds the pod's claim, so that
// the DRA driver gives it the tool. The simulator's seat keeps the
// simulator's in-place restart and the restricted user.
func TestSeatGroupSidecarsCanRestartTheirEngines(t *testing.T) {
	out := rendered{}
	for k, v := range decodeDocs(t, "seatgroup.yaml", renderSeatEngines(t)) {
		out[k] = v
	}
	var sts appsv1.StatefulSet
	out.get(t, "StatefulSet", "x-seat-gpu", &sts)
	pod := sts.Spec.Template.Spec
	if pod.ShareProcessNamespace == nil || !*pod.ShareProcessNamespace {
		t.Error("the group pod does not share its process namespace")
	}
	containers := map[string]corev1.Container{}
	for _, c := range pod.Containers {
		containers[c.Name] = c
	}
	for _, app := range []string{"chat", "code", "summarise"} {
		seat, engine := containers["sidecar-"+app], containers["engine-"+app]
		if !slices.Contains(seat.Args, "--restart-process") || !slices.Contains(seat.Args, "--nvidia-smi=nvidia-smi") {
			t.Errorf("sidecar-%s args %v: want --restart-process and --nvidia-smi=nvidia-smi", app, seat.Args)
		}
		// The seat runs as its engine's user and group: our Ollama image's
		// 65532 (code), the upstream images' root (chat: vLLM, summarise:
		// llama.cpp), whose user the engine container leaves to its image.
		// Each engine loads copies of its model, so both run with the
		// copies' group (64000), which reads the node agent's tiers.
		sc, esc := seat.SecurityContext, engine.SecurityContext
		wantUser, wantGroup := map[string]int64{"code": 65532}[app], int64(64000)
		if sc == nil || !cmp.Equal(sc.RunAsUser, &wantUser) || !cmp.Equal(sc.RunAsGroup, &wantGroup) {
			t.Errorf("sidecar-%s must run as its engine's user %d and group %d: sidecar %+v", app, wantUser, wantGroup, sc)
			continue
		}
		if wantUser == 0 && (esc.RunAsUser != nil || !cmp.Equal(esc.RunAsGroup, &wantGroup)) || wantUser != 0 && (!cmp.Equal(esc.RunAsUser, &wantUser) || !cmp.Equal(esc.RunAsGroup, &wantGroup)) {
			t.Errorf("engine-%s runs as user %v group %v; want its sidecar's %d (unset: the image's root) and group %d", app, esc.RunAsUser, esc.RunAsGroup, wantUser, wantGroup)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
			t.Errorf("sidecar-%s: want no privilege escalation and every capability dropped, got %+v", app, sc)
		}
		if len(seat.Resources.Claims) != 1 || seat.Resources.Claims[0].Name != "gpu" {
			t.Errorf("sidecar-%s claims %+v, want the pod's gpu claim", app, seat.Resources.Claims)
		}
	}

	// The simulator sample: the in-place restart, the restricted user.
	simPod := simSeatGroupPod(t)
	if p := simPod.ShareProcessNamespace; p == nil || !*p {
		t.Error("the simulator group pod does not share its process namespace")
	}
	for _, c := range simPod.Containers {
		if !strings.HasPrefix(c.Name, "sidecar-") {
			continue
		}
		if slices.Contains(c.Args, "--restart-process") || c.SecurityContext.RunAsUser == nil || *c.SecurityContext.RunAsUser != 65532 {
			t.Errorf("%s of a simulator: args %v user %v; want the simulator's own restart and user 65532", c.Name, c.Args, c.SecurityContext.RunAsUser)
		}
	}
}

// podSecurity evaluates a pod spec at a Pod Security level and returns the
// reasons it is forbidden (none: admitted).
func podSecurity(t *testing.T, level psapi.Level, spec *corev1.PodSpec) []string {
	t.Helper()
	e, err := pspolicy.NewEvaluator(pspolicy.DefaultChecks(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, r := range e.EvaluatePod(psapi.LevelVersion{Level: level, Version: psapi.LatestVersion()}, &metav1.ObjectMeta{}, spec) {
		if !r.Allowed {
			reasons = append(reasons, r.ForbiddenReason)
		}
	}
	sort.Strings(reasons)
	return reasons
}

// TestSeatGroupPodSecurity: sharing the process namespace changes no Pod
// Security verdict (the restricted level allows it). What keeps the group
// pods from the restricted level is known and unchanged: the vLLM and
// llama.cpp engines, and the seats that restart them, run as the upstream
// images' root user (with every capability dropped; Ollama and its sidecar
// run as 65532), and the simulators and the engines that load copies of
// their model mount the node agent's tier directories (hostPath, which also
// rules out baseline). The same pod
// with every container run as a non-root user passes the restricted level
// but for those volumes.
func TestSeatGroupPodSecurity(t *testing.T) {
	var gpu appsv1.StatefulSet
	decodeDocs(t, "seatgroup.yaml", renderSeatEngines(t)).get(t, "StatefulSet", "x-seat-gpu", &gpu)
	rootUsers := []string{"runAsNonRoot != true", "runAsUser=0"}
	tierVolumes := []string{"hostPath volumes", "restricted volume types"}
	for _, tc := range []struct {
		name    string
		spec    corev1.PodSpec
		volumes []string // forbidden for the pod's volumes, whatever its users
	}{
		// Engines that load copies of their model mount the agent's
		// tiers, as the simulators do.
		{"vllm, ollama, llamacpp", gpu.Spec.Template.Spec, tierVolumes},
		{"simulators", simSeatGroupPod(t), tierVolumes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := tc.spec
			for _, r := range podSecurity(t, psapi.LevelBaseline, &spec) {
				if !slices.Contains(tc.volumes, r) {
					t.Errorf("baseline forbids the group pod for %q", r)
				}
			}
			restricted := podSecurity(t, psapi.LevelRestricted, &spec)
			for _, r := range restricted {
				if !slices.Contains(rootUsers, r) && !slices.Contains(tc.volumes, r) {
					t.Errorf("restricted forbids the group pod for %q, want only its root users %v and volumes %v", r, rootUsers, tc.volumes)
				}
			}
			unshared := *spec.DeepCopy()
			unshared.ShareProcessNamespace = nil
			if d := cmp.Diff(restricted, podSecurity(t, psapi.LevelRestricted, &unshared)); d != "" {
				t.Errorf("shareProcessNamespace changes the restricted verdict (-shared +unshared):\n%s", d)
			}
			nonRoot := *spec.DeepCopy()
			for _, cs := range [][]corev1.Container{nonRoot.InitContainers, nonRoot.Containers} {
				for i := range cs {
					if sc := cs[i].SecurityContext; sc != nil {
						sc.RunAsUser, sc.RunAsGroup, sc.RunAsNonRoot = nil, nil, nil
					}
				}
			}
			uid, yes := int64(65532), true
			if nonRoot.SecurityContext == nil {
				nonRoot.SecurityContext = &corev1.PodSecurityContext{}
			}
			nonRoot.SecurityContext.RunAsUser, nonRoot.SecurityContext.RunAsNonRoot = &uid, &yes
			for _, r := range podSecurity(t, psapi.LevelRestricted, &nonRoot) {
				if !slices.Contains(tc.volumes, r) {
					t.Errorf("restricted forbids the group pod with non-root users and a shared process namespace for %q", r)
				}
			}
		})
	}
}
