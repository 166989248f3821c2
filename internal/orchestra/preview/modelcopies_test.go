package preview

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/ptr"
)

// TestEnginesLoadTheHottestCopy checks what the chart renders when the
// operator sets lifecycle.sleep.modelCopies (and coldPath) for Ollama and
// llama.cpp: the node agent mounts their model caches; each root's sidecar
// gets the link, the model file and the namespace's tier directories
// (read-only) and runs as our image's non-root user without any capability,
// reading them as a member of their group (global.agent.copyGroup, which
// the node agent runs with and gives its copies); the engine runs as its
// image's user (set for our Ollama image: 65532) with the same group, mounts the same directories read-only
// and the link's emptyDir,
// Ollama's start script links its blob to the link and llama.cpp's preset
// loads the link; the leader's configuration says modelCopies. Without
// the value nothing of it is rendered.
func TestEnginesLoadTheHottestCopy(t *testing.T) {
	vals := readValues(t, sleepValues)
	apps := vals["global"].(map[string]any)["applications"].(map[string]any)
	files := map[string]string{"ollama": "qwen2.5-0.5b-instruct-q4_k_m.gguf", "llama": "tinyllama.Q4_K_M.gguf"}

	before := renderObjects(t, vals)
	for app := range files {
		var sts appsv1.StatefulSet
		before.get(t, "StatefulSet", "x-"+app, &sts)
		for _, c := range sts.Spec.Template.Spec.Containers {
			for _, m := range c.VolumeMounts {
				if m.Name == "hot" || m.Name == "model-link" {
					t.Errorf("%s: container %s mounts %s without modelCopies", app, c.Name, m.Name)
				}
			}
		}
	}

	for app, file := range files {
		s := apps[app].(map[string]any)["lifecycle"].(map[string]any)["sleep"].(map[string]any)
		s["coldPath"], s["modelCopies"] = app+"/"+file, true
	}
	// vLLM's model directory (the whole cache: no model.file), on a cache
	// the agent does not mount: no coldPath, its copies come through the
	// sidecar.
	apps["vllm"].(map[string]any)["lifecycle"].(map[string]any)["sleep"].(map[string]any)["modelCopies"] = true
	const group = 5005 // global.agent.copyGroup, not the default
	vals["global"].(map[string]any)["agent"].(map[string]any)["copyGroup"] = group
	objs := renderObjects(t, vals)

	var ds appsv1.DaemonSet
	objs.get(t, "DaemonSet", "x-agent", &ds)
	agent := container(t, ds.Spec.Template.Spec, "agent")
	if !slices.Contains(agent.Args, "--copy-group=5005") || ds.Spec.Template.Spec.SecurityContext == nil || !slices.Equal(ds.Spec.Template.Spec.SecurityContext.SupplementalGroups, []int64{group}) {
		t.Errorf("agent args %q, pod security context %+v; want the copies' group as --copy-group and a supplementary group", agent.Args, ds.Spec.Template.Spec.SecurityContext)
	}
	for app := range files {
		want := corev1.VolumeMount{Name: "cold-" + app, MountPath: "/var/lib/orchestra-agent/cold/" + app, ReadOnly: true}
		if !slices.Contains(agent.VolumeMounts, want) {
			t.Errorf("agent mounts %+v, want %+v", agent.VolumeMounts, want)
		}
	}

	tierMounts := []corev1.VolumeMount{
		{Name: "hot", MountPath: "/var/run/model-orchestra/hot", ReadOnly: true},
		{Name: "warm", MountPath: "/var/run/model-orchestra/warm", ReadOnly: true},
		{Name: "model-link", MountPath: "/var/run/model-orchestra/link"},
	}
	for app, file := range files {
		var sts appsv1.StatefulSet
		objs.get(t, "StatefulSet", "x-"+app, &sts)
		pod := sts.Spec.Template.Spec
		engine, seat := container(t, pod, "engine"), container(t, pod, "sidecar")
		for _, m := range tierMounts {
			if !slices.Contains(engine.VolumeMounts, m) || !slices.Contains(seat.VolumeMounts, m) {
				t.Errorf("%s: engine mounts %+v, seat %+v; want both %+v", app, engine.VolumeMounts, seat.VolumeMounts, m)
			}
		}
		if !slices.Contains(seat.VolumeMounts, corev1.VolumeMount{Name: "model", MountPath: "/models", ReadOnly: true}) {
			t.Errorf("%s: seat mounts %+v; want the model cache read-only at /models", app, seat.VolumeMounts)
		}
		for _, a := range []string{"--model-link=/var/run/model-orchestra/link/model", "--model-dir=/models", "--model-file=" + file,
			"--copy-hot-dir=/var/run/model-orchestra/hot", "--copy-warm-dir=/var/run/model-orchestra/warm", "--copy-name=x-" + app} {
			if !slices.Contains(seat.Args, a) {
				t.Errorf("%s: seat args %q; want %s", app, seat.Args, a)
			}
		}
		if sc := seat.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 65532 || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: seat security context %+v; want our image's user 65532, non-root, with every capability dropped and a read-only root", app, sc)
		}
		// Our Ollama image's user is known (65532); llama.cpp's upstream
		// image runs as its image's user.
		wantUser := map[string]*int64{"ollama": ptr.To[int64](65532)}[app]
		if sc := engine.SecurityContext; sc == nil || !cmp.Equal(sc.RunAsUser, wantUser) || sc.RunAsGroup == nil || *sc.RunAsGroup != group || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s: engine security context %+v; want the user %v (nil: its image's), the copies' group %d (not root's, which containerd would give it), every capability dropped", app, sc, wantUser, group)
		}
		if psc := pod.SecurityContext; psc == nil || !slices.Equal(psc.SupplementalGroups, []int64{group}) || psc.RunAsUser != nil {
			t.Errorf("%s: pod security context %+v; want the copies' group %d as the one supplementary group", app, psc, group)
		}
		if why := privileges(pod); len(why) > 0 {
			t.Errorf("%s: the root pod gained privileges: %v", app, why)
		}
		vols := map[string]corev1.Volume{}
		for _, v := range pod.Volumes {
			vols[v.Name] = v
		}
		if v := vols["hot"]; v.HostPath == nil || v.HostPath.Path != "/dev/shm/model-orchestra/ns" {
			t.Errorf("%s: volume hot %+v; want the hot tier's namespace directory", app, v)
		}
		if v := vols["model-link"]; v.EmptyDir == nil {
			t.Errorf("%s: volume model-link %+v; want an emptyDir", app, v)
		}
	}

	var sts appsv1.StatefulSet
	objs.get(t, "StatefulSet", "x-ollama", &sts)
	engine := container(t, sts.Spec.Template.Spec, "engine")
	if env := envOf(engine); env["MODEL_LINK"] != "/var/run/model-orchestra/link/model" {
		t.Errorf("ollama env %v; want MODEL_LINK", env)
	}
	if script := strings.Join(engine.Args, "\n"); !strings.Contains(script, `ln -sf "$MODEL_LINK" "$OLLAMA_MODELS/blobs/sha256-$digest"`) {
		t.Errorf("ollama's start script does not link its blob to the sidecar's link:\n%s", script)
	}
	var cm corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-llama-llama", &cm)
	if !strings.Contains(cm.Data["models.ini"], "model = /var/run/model-orchestra/link/model") {
		t.Errorf("llama.cpp preset %q; want the model at the link", cm.Data["models.ini"])
	}
	objs.get(t, "StatefulSet", "x-llama", &sts)
	if llama := container(t, sts.Spec.Template.Spec, "engine"); len(llama.Command) < 3 || !strings.Contains(llama.Command[2], "until [ -e /var/run/model-orchestra/link/model ]") {
		t.Errorf("llama.cpp command %q; want it to wait for the link", llama.Command)
	} else if args := strings.Join(llama.Args, " "); !strings.Contains(args, "--models-preset /etc/orchestra/llama/models.ini") || !strings.Contains(args, "--port 8080") {
		// The wrapper passes the server's arguments on ("$@").
		t.Errorf("llama.cpp args %q; want the server's own (its router's preset, its port)", llama.Args)
	}

	// vLLM loads its model directory through the link, once the sidecar
	// placed it; its sidecar serves the files the agent copies.
	objs.get(t, "StatefulSet", "x-vllm", &sts)
	vpod := sts.Spec.Template.Spec
	vllm, vseat := container(t, vpod, "engine"), container(t, vpod, "sidecar")
	if len(vllm.Command) < 3 || !strings.Contains(vllm.Command[2], "until [ -e /var/run/model-orchestra/link/model ]") || !slices.Contains(vllm.Args, "--model=/var/run/model-orchestra/link/model") {
		t.Errorf("vllm command %q args %q; want it to wait for the link and load --model from it", vllm.Command, vllm.Args)
	}
	for _, m := range tierMounts {
		if !slices.Contains(vllm.VolumeMounts, m) || !slices.Contains(vseat.VolumeMounts, m) {
			t.Errorf("vllm: engine mounts %+v, seat %+v; want both %+v", vllm.VolumeMounts, vseat.VolumeMounts, m)
		}
	}
	for _, a := range []string{"--engine=vllm", "--model-link=/var/run/model-orchestra/link/model", "--model-dir=/models", "--model-file=", "--copy-name=x-vllm"} {
		if !slices.Contains(vseat.Args, a) {
			t.Errorf("vllm: seat args %q; want %s", vseat.Args, a)
		}
	}
	for _, m := range agent.VolumeMounts {
		if m.Name == "cold-vllm" {
			t.Errorf("the agent mounts vllm's cache %+v; its copies come through the sidecar", m)
		}
	}
	// The agents reach the sidecars' ports, to read the model's files.
	var np networkingv1.NetworkPolicy
	objs.get(t, "NetworkPolicy", "x-engines", &np)
	agentIn := false
	for _, rule := range np.Spec.Ingress {
		for _, from := range rule.From {
			if from.PodSelector != nil && from.PodSelector.MatchLabels["app.kubernetes.io/component"] == "checkpoint-agent" {
				agentIn = len(rule.Ports) == 1 && rule.Ports[0].Port != nil && rule.Ports[0].Port.IntValue() == 9300
			}
		}
	}
	if !agentIn {
		t.Errorf("the engines' NetworkPolicy %+v does not admit the node agents to the sidecar's port 9300 only", np.Spec.Ingress)
	}

	var cfgMap corev1.ConfigMap
	objs.get(t, "ConfigMap", "x-dispatcher", &cfgMap)
	if cfg := cfgMap.Data["dispatcher.yaml"]; strings.Count(cfg, "modelCopies: true") != 3 {
		t.Errorf("dispatcher configuration has %d modelCopies; want one per application:\n%s", strings.Count(cfg, "modelCopies: true"), cfg)
	}
}
