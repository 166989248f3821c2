package orchestra

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/plugin"
)

func dur(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }
func i32(n int32) *int32                   { return &n }
func boolp(b bool) *bool                   { return &b }

// defaultSleep is the effective sleep of an application that sets only
// sleepAfter (5m) and references no policy.
func defaultSleep() Sleep {
	return Sleep{
		After: 5 * time.Minute, Level: 1, VerifyInterval: 15 * time.Minute, Preemption: true,
		Tiers:            v1alpha1.CheckpointTiers{Hot: v1alpha1.HotTierRAM, Warm: v1alpha1.WarmTierDisk, Cold: v1alpha1.ColdTierModelCache},
		ResumeRAMSeconds: 1, ResumeNVMeSeconds: 5,
	}
}

func TestEffectiveSleep(t *testing.T) {
	fullPolicy := &v1alpha1.CheckpointPolicySpec{
		Triggers: v1alpha1.CheckpointTriggers{IdleSeconds: i32(600), ParkSeconds: i32(3600), IntervalSeconds: i32(120), Preemption: boolp(false)},
		Tiers:    v1alpha1.CheckpointTiers{Hot: v1alpha1.HotTierNone, Warm: v1alpha1.WarmTierDisk, Cold: v1alpha1.ColdTierS3},
		SLO:      v1alpha1.ResumeSLO{ResumeRAMSeconds: i32(2), ResumeNVMeSeconds: i32(20)},
	}
	for _, tc := range []struct {
		name   string
		lc     *v1alpha1.LifecycleSpec
		policy *v1alpha1.CheckpointPolicySpec
		want   func(s *Sleep)
	}{
		{name: "no lifecycle", want: func(s *Sleep) { s.After = 0 }},
		{name: "lifecycle without sleep", lc: &v1alpha1.LifecycleSpec{}, want: func(s *Sleep) { s.After = 0 }},
		{name: "inline sleepAfter takes every default", lc: &v1alpha1.LifecycleSpec{SleepAfter: dur(5 * time.Minute)}},
		{
			name: "policy alone", lc: &v1alpha1.LifecycleSpec{}, policy: fullPolicy,
			want: func(s *Sleep) {
				s.After, s.ParkAfter, s.VerifyInterval, s.Preemption = 10*time.Minute, time.Hour, 2*time.Minute, false
				s.Tiers = fullPolicy.Tiers
				s.ResumeRAMSeconds, s.ResumeNVMeSeconds = 2, 20
			},
		},
		{
			name: "inline fields win field by field",
			lc: &v1alpha1.LifecycleSpec{
				SleepAfter: dur(5 * time.Minute), SleepLevel: 2, ParkAfter: dur(30 * time.Minute),
				Tiers:     &v1alpha1.CheckpointTiers{Hot: v1alpha1.HotTierRAM},
				ResumeSLO: &v1alpha1.ResumeSLO{ResumeNVMeSeconds: i32(8)},
			},
			policy: fullPolicy,
			want: func(s *Sleep) {
				s.Level, s.ParkAfter, s.VerifyInterval, s.Preemption = 2, 30*time.Minute, 2*time.Minute, false
				s.Tiers = v1alpha1.CheckpointTiers{Hot: v1alpha1.HotTierRAM, Warm: v1alpha1.WarmTierDisk, Cold: v1alpha1.ColdTierS3}
				s.ResumeRAMSeconds, s.ResumeNVMeSeconds = 2, 8
			},
		},
		{
			name: "empty policy changes nothing", lc: &v1alpha1.LifecycleSpec{SleepAfter: dur(5 * time.Minute)},
			policy: &v1alpha1.CheckpointPolicySpec{},
		},
		{
			name: "policy without idleSeconds does not make it sleep", lc: &v1alpha1.LifecycleSpec{},
			policy: &v1alpha1.CheckpointPolicySpec{SLO: v1alpha1.ResumeSLO{ResumeRAMSeconds: i32(3)}},
			want:   func(s *Sleep) { s.After, s.ResumeRAMSeconds = 0, 3 },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := defaultSleep()
			if tc.want != nil {
				tc.want(&want)
			}
			got := EffectiveSleep(tc.lc, tc.policy)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("EffectiveSleep (-want +got):\n%s", diff)
			}
			if got.Enabled() != (want.After > 0) {
				t.Errorf("Enabled() = %v with After %v", got.Enabled(), got.After)
			}
		})
	}
}

func TestSleepSLOSeconds(t *testing.T) {
	s := defaultSleep()
	for tier, want := range map[v1alpha1.Tier]int32{v1alpha1.TierHot: 1, v1alpha1.TierWarm: 5} {
		if got, ok := s.SLOSeconds(tier); !ok || got != want {
			t.Errorf("SLOSeconds(%s) = %d, %v; want %d", tier, got, ok, want)
		}
	}
	for _, tier := range []v1alpha1.Tier{v1alpha1.TierAccelerator, v1alpha1.TierCold, ""} {
		if _, ok := s.SLOSeconds(tier); ok {
			t.Errorf("SLOSeconds(%q) has an SLO", tier)
		}
	}
}

// policyDoc is a CheckpointPolicy named name in namespace ns.
func policyDoc(t *testing.T, name, spec string) *unstructured.Unstructured {
	t.Helper()
	return fromYAML(t, "apiVersion: modelorchestra.io/v1alpha1\nkind: CheckpointPolicy\nmetadata: {name: "+name+", namespace: ns}\nspec: "+spec+"\n")
}

func TestTranslatorSleepValues(t *testing.T) {
	spec := `{seatGroups: {g: {}, s: {activeSeats: 2, deviceMemory: 1Gi}}, applications: {
    chat: {model: {source: "hf://org/repo", file: m.gguf, cache: {accessMode: ReadWriteMany}}, runtime: {engine: simulator, args: ["--weights-file=/models/m.gguf"]},
      lifecycle: {sleepAfter: 2m, zeroAfter: 30m, checkpointPolicy: fast, resumeSLO: {resumeRamSeconds: 3}}},
    seated: {model: {source: "hf://org/repo", file: m.gguf}, runtime: {engine: vllm, args: [x]}, lifecycle: {minReplicas: 1, checkpointPolicy: fast, seat: {group: g, priority: 7}}},
    plain: {model: {source: "hf://org/repo", file: m.gguf}, lifecycle: {checkpointPolicy: missing}},
    fixed: {model: {source: "hf://org/repo", file: m.gguf}},
    s3cold: {model: {source: "s3://models/llama", credentialsSecretRef: {name: s3-keys}, s3: {endpoint: "http://minio:9000"}},
      runtime: {engine: simulator, args: ["--weights-file=/models/w.bin"]}, lifecycle: {sleepAfter: 2m, zeroAfter: 30m, tiers: {cold: S3}}}}}`
	reader := PolicyDocuments{
		types.NamespacedName{Namespace: "ns", Name: "fast"}: policyDoc(t, "fast", "{triggers: {idleSeconds: 600, parkSeconds: 3600}, tiers: {warm: None, processSnapshots: true}}"),
	}
	ctx := plugin.WithReader(context.Background(), reader)
	vals, err := Translator{Getenv: func(string) string { return "" }}.Translate(ctx, owner(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) any {
		v, _, err := unstructured.NestedFieldNoCopy(vals, strings.Split(path, ".")...)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return v
	}
	wantChat := map[string]any{
		"after": "2m0s", "level": int64(1), "level1Tier": "Hot", "parkAfter": "1h0m0s", "verifyInterval": "15m0s", "preemption": true,
		"tiers": map[string]any{"hot": "RAM", "warm": "None", "cold": "ModelCache", "processSnapshots": true},
		"slo":   map[string]any{"resumeRamSeconds": int64(3), "resumeNvmeSeconds": int64(5)},
		// The node agent reads its weights in the shared model cache.
		"coldPath": "chat/m.gguf",
	}
	if diff := cmp.Diff(wantChat, get("global.applications.chat.lifecycle.sleep")); diff != "" {
		t.Errorf("chat's sleep (inline over the policy) (-want +got):\n%s", diff)
	}
	// The node agent reads s3cold's weights from its bucket.
	wantS3 := map[string]any{"url": "s3://models/llama/w.bin", "endpoint": "http://minio:9000", "credentialsSecret": "s3-keys"}
	if diff := cmp.Diff(wantS3, get("global.applications.s3cold.lifecycle.sleep.coldS3")); diff != "" {
		t.Errorf("s3cold's coldS3 (-want +got):\n%s", diff)
	}
	if got := get("global.applications.s3cold.lifecycle.sleep.coldPath"); got != nil {
		t.Errorf("s3cold's coldPath = %v, want none: its cold tier is S3", got)
	}
	if got := get("global.applications.seated.lifecycle.sleep.level1Tier"); got != "Hot" {
		t.Errorf("vLLM's level-1 sleep rests in %v, want Hot (its offload to RAM)", got)
	}
	if got := get("global.applications.seated.lifecycle.sleep.after"); got != "10m0s" {
		t.Errorf("seated sleeps after %v, want the policy's 10m0s", got)
	}
	if diff := cmp.Diff(map[string]any{"group": "g", "priority": int64(7), "minResidency": "30s"}, get("global.applications.seated.lifecycle.seat")); diff != "" {
		t.Errorf("seated's seat (-want +got):\n%s", diff)
	}
	for _, path := range []string{"global.applications.chat.lifecycle.seat", "global.applications.plain.lifecycle.sleep", "global.applications.fixed.lifecycle"} {
		if v := get(path); v != nil {
			t.Errorf("%s = %v, want none", path, v)
		}
	}
	if got := get("global.agent.enabled"); got != true {
		t.Errorf("global.agent.enabled = %v, want true: applications sleep", got)
	}

	wantGroups := map[string]any{"g": map[string]any{"activeSeats": int64(1), "replicas": int64(1)}, "s": map[string]any{"activeSeats": int64(2), "replicas": int64(1), "deviceMemory": int64(1 << 30)}}
	if diff := cmp.Diff(wantGroups, get("global.seatGroups")); diff != "" {
		t.Errorf("global.seatGroups (-want +got):\n%s", diff)
	}

	// Without a reader (or when the policies are missing) the inline
	// fields alone count: chat still sleeps when idle, seated does not,
	// but its seat group still puts it to sleep, so its engine gets its
	// sleep (level 1, the default) without an idle time.
	vals, err = Translator{Getenv: func(string) string { return "" }}.Translate(context.Background(), owner(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(vals, "global", "applications", "chat", "lifecycle", "sleep", "parkAfter"); got != "" {
		t.Errorf("without the policy chat parks after %q, want never", got)
	}
	seated, found, _ := unstructured.NestedMap(vals, "global", "applications", "seated", "lifecycle", "sleep")
	if !found {
		t.Fatal("without the policy seated's engine has no sleep, which its seat group needs")
	}
	if after, ok := seated["after"]; ok {
		t.Errorf("without the policy seated sleeps after %v when idle, want only when its group needs the seat", after)
	}
	if seated["level"] != int64(1) {
		t.Errorf("without the policy seated sleeps at level %v, want the default 1", seated["level"])
	}
	if got, _, _ := unstructured.NestedBool(vals, "global", "agent", "enabled"); !got {
		t.Error("global.agent.enabled is not set: a seat group's engines sleep into the node's tiers")
	}
}

// Ollama and llama.cpp unload the model at level 1: their wake reads the
// model cache, which the resident tier must say.
func TestLevel1Tier(t *testing.T) {
	for e, want := range map[v1alpha1.Engine]v1alpha1.Tier{
		v1alpha1.EngineSimulator: v1alpha1.TierHot, v1alpha1.EngineVLLM: v1alpha1.TierHot,
		v1alpha1.EngineOllama: v1alpha1.TierCold, v1alpha1.EngineLlamaCPP: v1alpha1.TierCold,
	} {
		if got := Level1Tier(e); got != want {
			t.Errorf("Level1Tier(%s) = %s, want %s", e, got, want)
		}
	}
}

func TestTranslatorNoAgentWithoutSleep(t *testing.T) {
	vals, err := Translator{Getenv: func(string) string { return "" }}.Translate(context.Background(),
		owner(t, `{applications: {chat: {model: {source: "hf://org/repo", file: m.gguf}, lifecycle: {zeroAfter: 5m}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(vals, "global", "agent"); found {
		t.Error("global.agent is set although no application sleeps")
	}
}

func TestColdPath(t *testing.T) {
	app := func(mutate func(*v1alpha1.Application)) v1alpha1.Application {
		a := v1alpha1.Application{
			Model:     v1alpha1.ModelSpec{Source: "hf://org/repo", File: "m.gguf", Cache: &v1alpha1.CacheSpec{AccessMode: corev1.ReadWriteMany}},
			Runtime:   v1alpha1.RuntimeSpec{Engine: v1alpha1.EngineSimulator, Args: []string{"--weights-file=/models/m.gguf"}},
			Lifecycle: &v1alpha1.LifecycleSpec{SleepAfter: &metav1.Duration{Duration: time.Minute}},
		}
		if mutate != nil {
			mutate(&a)
		}
		return a
	}
	for _, tc := range []struct {
		name string
		app  v1alpha1.Application
		want string
	}{
		{"shared cache, weights from it", app(nil), "chat/m.gguf"},
		{"a file in a directory", app(func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-file=/models/sub/w.bin"} }), "chat/sub/w.bin"},
		{"outside the cache", app(func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-file=/models/../etc/passwd"} }), ""},
		{"synthetic weights", app(func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-bytes=1GiB"} }), ""},
		{"ReadWriteOnce cache", app(func(a *v1alpha1.Application) { a.Model.Cache.AccessMode = corev1.ReadWriteOnce }), ""},
		{"default access mode", app(func(a *v1alpha1.Application) { a.Model.Cache = nil }), ""},
		{"existing claim", app(func(a *v1alpha1.Application) { a.Model.Cache = &v1alpha1.CacheSpec{ExistingClaim: "mine"} }), ""},
		{"pvc source", app(func(a *v1alpha1.Application) { a.Model.Source, a.Model.Cache = "pvc://claim/dir", nil }), ""},
		{"vllm", app(func(a *v1alpha1.Application) { a.Runtime.Engine = v1alpha1.EngineVLLM }), ""},
		{"ollama: its model file", app(func(a *v1alpha1.Application) { a.Runtime.Engine, a.Runtime.Args = v1alpha1.EngineOllama, nil }), "chat/m.gguf"},
		{"llama.cpp: its model file in a directory", app(func(a *v1alpha1.Application) {
			a.Runtime.Engine, a.Runtime.Args, a.Model.File = v1alpha1.EngineLlamaCPP, nil, "q4/m.gguf"
		}), "chat/q4/m.gguf"},
		{"ollama without a model file", app(func(a *v1alpha1.Application) { a.Runtime.Engine, a.Model.File = v1alpha1.EngineOllama, "" }), ""},
		{"ollama, a model file outside the cache", app(func(a *v1alpha1.Application) { a.Runtime.Engine, a.Model.File = v1alpha1.EngineOllama, "../x.gguf" }), ""},
		{"ollama in a seat group", app(func(a *v1alpha1.Application) {
			a.Runtime.Engine, a.Lifecycle.Seat = v1alpha1.EngineOllama, &v1alpha1.SeatSpec{Group: "g"}
		}), ""},
		{"ollama, ReadWriteOnce cache", app(func(a *v1alpha1.Application) {
			a.Runtime.Engine, a.Model.Cache.AccessMode = v1alpha1.EngineOllama, corev1.ReadWriteOnce
		}), ""},
		{"does not sleep", app(func(a *v1alpha1.Application) { a.Lifecycle.SleepAfter = nil }), ""},
		{"no lifecycle", app(func(a *v1alpha1.Application) { a.Lifecycle = nil }), ""},
		{"seat without sleepAfter", app(func(a *v1alpha1.Application) {
			a.Lifecycle.SleepAfter, a.Lifecycle.Seat = nil, &v1alpha1.SeatSpec{Group: "g"}
		}), "chat/m.gguf"},
		{"cold tier S3", app(func(a *v1alpha1.Application) {
			a.Lifecycle.Tiers = &v1alpha1.CheckpointTiers{Cold: v1alpha1.ColdTierS3}
		}), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ColdPath("chat", tc.app, EffectiveSleep(tc.app.Lifecycle, nil)); got != tc.want {
				t.Errorf("ColdPath = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestModelCopies pins which engines load the hottest verified copy of
// their model file: Ollama and llama.cpp that sleep outside a seat group
// with a model file the fetcher's manifest vouches for, whatever the
// cache's access mode.
func TestModelCopies(t *testing.T) {
	app := func(engine v1alpha1.Engine, mutate func(*v1alpha1.Application)) v1alpha1.Application {
		a := v1alpha1.Application{
			Model:     v1alpha1.ModelSpec{Source: "hf://org/repo", File: "m.gguf", Cache: &v1alpha1.CacheSpec{AccessMode: corev1.ReadWriteMany}},
			Runtime:   v1alpha1.RuntimeSpec{Engine: engine},
			Lifecycle: &v1alpha1.LifecycleSpec{SleepAfter: &metav1.Duration{Duration: time.Minute}},
		}
		if mutate != nil {
			mutate(&a)
		}
		return a
	}
	for _, tc := range []struct {
		name string
		app  v1alpha1.Application
		want bool
	}{
		{"ollama", app(v1alpha1.EngineOllama, nil), true},
		{"llama.cpp", app(v1alpha1.EngineLlamaCPP, nil), true},
		{"the simulator reads the tiers itself", app(v1alpha1.EngineSimulator, func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-file=/models/m.gguf"} }), false},
		{"vllm: its model directory", app(v1alpha1.EngineVLLM, func(a *v1alpha1.Application) { a.Model.File = "llama" }), true},
		{"vllm: the whole cache", app(v1alpha1.EngineVLLM, func(a *v1alpha1.Application) { a.Model.File = "" }), true},
		{"multi-node vllm loads the model on every node", app(v1alpha1.EngineVLLM, func(a *v1alpha1.Application) { a.Model.File, a.Runtime.Workers = "", 1 }), false},
		{"ollama, ReadWriteOnce cache: the agent reads it through the sidecar", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) { a.Model.Cache.AccessMode = corev1.ReadWriteOnce }), true},
		{"llama.cpp, the default cache", app(v1alpha1.EngineLlamaCPP, func(a *v1alpha1.Application) { a.Model.Cache = nil }), true},
		{"ollama, an existing claim", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) { a.Model.Cache.ExistingClaim = "models" }), true},
		{"ollama, a pvc:// source: no fetcher manifest vouches for a copy", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) { a.Model.Source, a.Model.Cache = "pvc://models/gguf", nil }), false},
		{"ollama without a model file", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) { a.Model.File = "" }), false},
		{"ollama in a seat group", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) { a.Lifecycle.Seat = &v1alpha1.SeatSpec{Group: "g"} }), true},
		{"vllm in a seat group, without sleepAfter", app(v1alpha1.EngineVLLM, func(a *v1alpha1.Application) {
			a.Model.File, a.Lifecycle.SleepAfter, a.Lifecycle.Seat = "", nil, &v1alpha1.SeatSpec{Group: "g"}
		}), true},
		{"ollama that does not sleep", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) { a.Lifecycle.SleepAfter = nil }), false},
		{"ollama, cold tier S3", app(v1alpha1.EngineOllama, func(a *v1alpha1.Application) {
			a.Lifecycle.Tiers = &v1alpha1.CheckpointTiers{Cold: v1alpha1.ColdTierS3}
		}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ModelCopies("chat", tc.app, EffectiveSleep(tc.app.Lifecycle, nil)); got != tc.want {
				t.Errorf("ModelCopies = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestColdS3Location(t *testing.T) {
	app := func(mutate func(*v1alpha1.Application)) v1alpha1.Application {
		a := v1alpha1.Application{
			Model: v1alpha1.ModelSpec{
				Source: "s3://models/llama/v1", CredentialsSecretRef: &corev1.LocalObjectReference{Name: "s3-keys"},
				S3: &v1alpha1.S3Spec{Endpoint: "http://minio.storage:9000", Region: "eu-1"},
			},
			Runtime: v1alpha1.RuntimeSpec{Engine: v1alpha1.EngineSimulator, Args: []string{"--weights-file=/models/w.bin"}},
			Lifecycle: &v1alpha1.LifecycleSpec{SleepAfter: &metav1.Duration{Duration: time.Minute},
				Tiers: &v1alpha1.CheckpointTiers{Cold: v1alpha1.ColdTierS3}},
		}
		if mutate != nil {
			mutate(&a)
		}
		return a
	}
	full := ColdS3{URL: "s3://models/llama/v1/w.bin", Endpoint: "http://minio.storage:9000", Region: "eu-1", CredentialsSecret: "s3-keys"}
	for _, tc := range []struct {
		name string
		app  v1alpha1.Application
		want ColdS3
		why  string // substring of the reason; empty: none
	}{
		{"the model's object", app(nil), full, ""},
		{"a bucket without a prefix, a file in a directory", app(func(a *v1alpha1.Application) {
			a.Model.Source, a.Runtime.Args = "s3://models", []string{"--weights-file=/models/sub/w.bin"}
		}), ColdS3{URL: "s3://models/sub/w.bin", Endpoint: full.Endpoint, Region: full.Region, CredentialsSecret: "s3-keys"}, ""},
		{"a prefix with a trailing slash, AWS", app(func(a *v1alpha1.Application) { a.Model.Source, a.Model.S3 = "s3://models/llama/", nil }),
			ColdS3{URL: "s3://models/llama/w.bin", CredentialsSecret: "s3-keys"}, ""},
		{"a seat without sleepAfter", app(func(a *v1alpha1.Application) {
			a.Lifecycle.SleepAfter, a.Lifecycle.Seat = nil, &v1alpha1.SeatSpec{Group: "g"}
		}), full, ""},
		{"cold tier ModelCache", app(func(a *v1alpha1.Application) { a.Lifecycle.Tiers = nil }), ColdS3{}, ""},
		{"does not sleep", app(func(a *v1alpha1.Application) { a.Lifecycle.SleepAfter = nil }), ColdS3{}, ""},
		{"an hf:// source", app(func(a *v1alpha1.Application) { a.Model.Source = "hf://org/repo" }), ColdS3{},
			`chat: tiers.cold is S3, but model.source "hf://org/repo" is not an s3:// source`},
		{"a pvc:// source", app(func(a *v1alpha1.Application) { a.Model.Source = "pvc://claim/dir" }), ColdS3{}, "is not an s3:// source"},
		{"vLLM", app(func(a *v1alpha1.Application) { a.Runtime.Engine = v1alpha1.EngineVLLM }), ColdS3{}, "chat: tiers.cold is S3, but runtime.engine is vllm"},
		{"synthetic weights", app(func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-bytes=1GiB"} }), ColdS3{},
			"chat: tiers.cold is S3, but runtime.args have no --weights-file=/models/<file>"},
		{"weights outside the cache", app(func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-file=/models/../etc/passwd"} }), ColdS3{}, "no --weights-file"},
		{"a comma in the file", app(func(a *v1alpha1.Application) { a.Runtime.Args = []string{"--weights-file=/models/a,b.bin"} }), ColdS3{}, "no --weights-file"},
		{"no credentials Secret", app(func(a *v1alpha1.Application) { a.Model.CredentialsSecretRef = nil }), ColdS3{},
			"chat: tiers.cold is S3, but model.credentialsSecretRef is not set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := ColdS3Location("chat", tc.app, EffectiveSleep(tc.app.Lifecycle, nil))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ColdS3Location (-want +got):\n%s", diff)
			}
			if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) {
				t.Errorf("reason %q, want one containing %q", why, tc.why)
			}
			if ColdPath("chat", tc.app, EffectiveSleep(tc.app.Lifecycle, nil)) != "" {
				t.Error("an S3 cold tier also has a model-cache coldPath")
			}
		})
	}
}
