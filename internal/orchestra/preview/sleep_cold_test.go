package preview

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/fetch/s3cred"
)

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
	// The agent reads the files the fetcher names (nodeagent.ColdS3Source).
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
