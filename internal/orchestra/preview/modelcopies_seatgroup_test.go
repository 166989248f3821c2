package preview

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// TestSeatGroupMembersLoadCopies: in a seat group's pod each member whose
// engine loads copies of its model (vLLM, Ollama, llama.cpp with
// modelCopies) gets what an application's root pod gets: its sidecar
// points a link of its own (the emptyDir model-link-<app>) at the hottest
// verified copy, reading the model cache it mounts and the agent's tier
// directories the pod mounts once; the pod has the copies' group; and the
// dispatcher's leader configuration tells the leader to ask the node agent
// for a copy when the member falls asleep.
func TestSeatGroupMembersLoadCopies(t *testing.T) {
	files, err := renderWithCapabilities(t, readValues(t, seatEnginesValues), true)
	if err != nil {
		t.Fatal(err)
	}
	var sts appsv1.StatefulSet
	decodeDocs(t, "seatgroup.yaml", manifestOf(files, "seatgroup.yaml")).get(t, "StatefulSet", "x-seat-gpu", &sts)
	pod := sts.Spec.Template.Spec
	if psc := pod.SecurityContext; psc == nil || !slices.Equal(psc.SupplementalGroups, []int64{64000}) {
		t.Errorf("group pod security context %+v; want the copies' group as a supplementary group", psc)
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	if v := vols["hot"]; v.HostPath == nil || v.HostPath.Path != "/dev/shm/model-orchestra/ns" {
		t.Errorf("volume hot %+v; want the hot tier's namespace directory, once for the pod", v)
	}
	if _, ok := vols["device"]; ok {
		t.Error("the group pod has the simulators' device pool without a simulator")
	}
	containers := map[string]corev1.Container{}
	for _, c := range pod.Containers {
		containers[c.Name] = c
	}
	files2 := map[string]string{"chat": "", "code": "qwen2.5-0.5b-instruct-q4_k_m.gguf", "summarise": "qwen2.5-0.5b-instruct-q4_k_m.gguf"}
	for app, file := range files2 {
		if v := vols["model-link-"+app]; v.EmptyDir == nil {
			t.Errorf("%s: volume model-link-%s %+v; want an emptyDir of its own", app, app, v)
		}
		link := corev1.VolumeMount{Name: "model-link-" + app, MountPath: "/var/run/model-orchestra/link"}
		hot := corev1.VolumeMount{Name: "hot", MountPath: "/var/run/model-orchestra/hot", ReadOnly: true}
		engine, seat := containers["engine-"+app], containers["sidecar-"+app]
		for _, m := range []corev1.VolumeMount{link, hot} {
			if !slices.Contains(engine.VolumeMounts, m) || !slices.Contains(seat.VolumeMounts, m) {
				t.Errorf("%s: engine mounts %+v, sidecar %+v; want both %+v", app, engine.VolumeMounts, seat.VolumeMounts, m)
			}
		}
		if !slices.Contains(seat.VolumeMounts, corev1.VolumeMount{Name: "model-" + app, MountPath: "/models", ReadOnly: true}) {
			t.Errorf("%s: sidecar mounts %+v; want its model cache read-only at /models", app, seat.VolumeMounts)
		}
		for _, a := range []string{"--model-link=/var/run/model-orchestra/link/model", "--model-dir=/models", "--model-file=" + file, "--copy-name=x-" + app} {
			if !slices.Contains(seat.Args, a) {
				t.Errorf("%s: sidecar args %q; want %s", app, seat.Args, a)
			}
		}
	}
	if c := containers["engine-summarise"]; len(c.Command) < 3 || !strings.Contains(c.Command[2], "until [ -e /var/run/model-orchestra/link/model ]") || !slices.Contains(c.Args, "--models-preset") {
		t.Errorf("llama.cpp member command %q args %q; want it to wait for the link and keep its arguments", c.Command, c.Args)
	}
	if c := containers["engine-chat"]; !slices.Contains(c.Args, "--model=/var/run/model-orchestra/link/model") {
		t.Errorf("vLLM member args %q; want --model at the link", c.Args)
	}
	var cm corev1.ConfigMap
	decodeDocs(t, "topology.yaml", manifestOf(files, "topology.yaml")).get(t, "ConfigMap", "x-summarise-llama", &cm)
	if !strings.Contains(cm.Data["models.ini"], "model = /var/run/model-orchestra/link/model") {
		t.Errorf("llama.cpp member preset %q; want the model at the link", cm.Data["models.ini"])
	}
	var dcm corev1.ConfigMap
	decodeDocs(t, "dispatcher.yaml", manifestOf(files, "dispatcher.yaml")).get(t, "ConfigMap", "x-dispatcher", &dcm)
	if cfg := dcm.Data["dispatcher.yaml"]; strings.Count(cfg, "modelCopies: true") != 3 || strings.Count(cfg, `warmTier: "Disk"`) < 3 {
		t.Errorf("the leader's configuration has %d members with modelCopies; want 3, with their warm tier:\n%s", strings.Count(cfg, "modelCopies: true"), cfg)
	}
}
