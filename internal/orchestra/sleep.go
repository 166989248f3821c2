package orchestra

import (
	"fmt"
	"path"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/fetch/s3cred"
)

// The defaults of sleeping engines and accelerator seats, documented on the
// API fields (those several binaries apply, the sleep level, the seat's
// minimum residency, the verify interval and the resume SLO, are
// api/v1alpha1's). EffectiveSleep and effectiveSeat are the only places that
// apply them; the chart and the dispatcher receive the resolved values.
const (
	DefaultVerifyInterval    = v1alpha1.DefaultVerifyInterval
	DefaultPreemption        = true
	DefaultHotTier           = v1alpha1.HotTierRAM
	DefaultWarmTier          = v1alpha1.WarmTierDisk
	DefaultColdTier          = v1alpha1.ColdTierModelCache
	DefaultProcessSnapshots  = false
	DefaultResumeRAMSeconds  = v1alpha1.DefaultResumeRAMSeconds
	DefaultResumeNVMeSeconds = v1alpha1.DefaultResumeNVMeSeconds
)

// Sleep is the effective sleep of one application: its inline lifecycle
// fields over its CheckpointPolicy's, field by field, with the defaults
// applied.
type Sleep struct {
	// After is the idle time before the engine sleeps; 0 means it never
	// sleeps (and every other field is then meaningless).
	After time.Duration
	// Level is 1 (weights to the hot tier) or 2 (weights dropped).
	Level int32
	// ParkAfter is the time asleep in the hot tier before the weights are
	// demoted to the warm tier; 0 means never.
	ParkAfter time.Duration
	// VerifyInterval is the period at which tier copies are re-hashed.
	VerifyInterval time.Duration
	// Preemption lets a seat group put the engine to sleep early.
	Preemption bool
	// Tiers are where the weights may rest.
	Tiers v1alpha1.CheckpointTiers
	// ResumeRAMSeconds and ResumeNVMeSeconds are the resume SLO per tier.
	ResumeRAMSeconds  int32
	ResumeNVMeSeconds int32
}

// ProcessSnapshots reports whether tiers.processSnapshots is on.
func (s Sleep) ProcessSnapshots() bool {
	if s.Tiers.ProcessSnapshots == nil {
		return DefaultProcessSnapshots
	}
	return *s.Tiers.ProcessSnapshots
}

// Enabled reports whether the application sleeps at all.
func (s Sleep) Enabled() bool { return s.After > 0 }

// SLOSeconds is the resume SLO of a wake from tier, and false for a tier
// without one (the accelerator, where nothing resumes, and the cold tier,
// whose wake is a model load bounded by lifecycle.maxWait).
func (s Sleep) SLOSeconds(tier v1alpha1.Tier) (int32, bool) {
	switch tier {
	case v1alpha1.TierHot:
		return s.ResumeRAMSeconds, true
	case v1alpha1.TierWarm:
		return s.ResumeNVMeSeconds, true
	default:
		return 0, false
	}
}

// EffectiveSleep merges an application's lifecycle with the CheckpointPolicy
// it references (nil when it references none, or the policy is missing):
// every field set inline wins over the policy's, and what neither sets
// takes its default. lc may be nil.
func EffectiveSleep(lc *v1alpha1.LifecycleSpec, policy *v1alpha1.CheckpointPolicySpec) Sleep {
	var p v1alpha1.CheckpointPolicySpec
	if policy != nil {
		p = *policy
	}
	if lc == nil {
		lc = &v1alpha1.LifecycleSpec{}
	}
	s := Sleep{
		Level:             v1alpha1.DefaultSleepLevel,
		VerifyInterval:    DefaultVerifyInterval,
		Preemption:        DefaultPreemption,
		Tiers:             v1alpha1.CheckpointTiers{Hot: DefaultHotTier, Warm: DefaultWarmTier, Cold: DefaultColdTier},
		ResumeRAMSeconds:  DefaultResumeRAMSeconds,
		ResumeNVMeSeconds: DefaultResumeNVMeSeconds,
	}

	switch {
	case lc.SleepAfter != nil:
		s.After = lc.SleepAfter.Duration
	case p.Triggers.IdleSeconds != nil:
		s.After = seconds(*p.Triggers.IdleSeconds)
	}
	if lc.SleepLevel != 0 {
		s.Level = lc.SleepLevel
	}
	switch {
	case lc.ParkAfter != nil:
		s.ParkAfter = lc.ParkAfter.Duration
	case p.Triggers.ParkSeconds != nil:
		s.ParkAfter = seconds(*p.Triggers.ParkSeconds)
	}
	if p.Triggers.IntervalSeconds != nil {
		s.VerifyInterval = seconds(*p.Triggers.IntervalSeconds)
	}
	if p.Triggers.Preemption != nil {
		s.Preemption = *p.Triggers.Preemption
	}

	tiers := []v1alpha1.CheckpointTiers{p.Tiers}
	if lc.Tiers != nil {
		tiers = append(tiers, *lc.Tiers)
	}
	for _, t := range tiers { // later wins: the policy, then inline
		if t.Hot != "" {
			s.Tiers.Hot = t.Hot
		}
		if t.Warm != "" {
			s.Tiers.Warm = t.Warm
		}
		if t.Cold != "" {
			s.Tiers.Cold = t.Cold
		}
		if t.ProcessSnapshots != nil {
			s.Tiers.ProcessSnapshots = t.ProcessSnapshots
		}
	}
	slos := []v1alpha1.ResumeSLO{p.SLO}
	if lc.ResumeSLO != nil {
		slos = append(slos, *lc.ResumeSLO)
	}
	for _, o := range slos {
		if o.ResumeRAMSeconds != nil {
			s.ResumeRAMSeconds = *o.ResumeRAMSeconds
		}
		if o.ResumeNVMeSeconds != nil {
			s.ResumeNVMeSeconds = *o.ResumeNVMeSeconds
		}
	}
	return s
}

func seconds(n int32) time.Duration { return time.Duration(n) * time.Second }

// sleepValues is the effective sleep as the chart's
// global.applications.<app>.lifecycle.sleep value; "after" only when the
// application sleeps when idle.
func sleepValues(s Sleep) map[string]any {
	park := ""
	if s.ParkAfter > 0 {
		park = s.ParkAfter.String()
	}
	out := map[string]any{
		"level":          int64(s.Level),
		"parkAfter":      park,
		"verifyInterval": s.VerifyInterval.String(),
		"preemption":     s.Preemption,
		"tiers": map[string]any{
			"hot":  string(s.Tiers.Hot),
			"warm": string(s.Tiers.Warm),
			"cold": string(s.Tiers.Cold),
			// The node agent is rendered with criu's privileges only
			// when an application of the release turns this on.
			"processSnapshots": s.ProcessSnapshots(),
		},
		"slo": map[string]any{
			"resumeRamSeconds":  int64(s.ResumeRAMSeconds),
			"resumeNvmeSeconds": int64(s.ResumeNVMeSeconds),
		},
	}
	if s.Enabled() {
		out["after"] = s.After.String()
	}
	return out
}

func hasSeat(app v1alpha1.Application) bool {
	return app.Lifecycle != nil && app.Lifecycle.Seat != nil
}

// seatGroupValues are spec.seatGroups as the chart's global.seatGroups
// value, with their defaults.
func seatGroupValues(groups map[string]v1alpha1.SeatGroupSpec) map[string]any {
	out := make(map[string]any, len(groups))
	for name, g := range groups {
		v := map[string]any{"activeSeats": int64(max(g.ActiveSeats, v1alpha1.DefaultActiveSeats)), "replicas": int64(max(g.Replicas, v1alpha1.DefaultSeatGroupReplicas))}
		if g.DeviceMemory != nil {
			v["deviceMemory"] = g.DeviceMemory.Value()
		}
		out[name] = v
	}
	return out
}

// seatValues is an application's seat as the chart's
// global.applications.<app>.lifecycle.seat value, with its defaults.
func seatValues(seat *v1alpha1.SeatSpec) map[string]any {
	minResidency := v1alpha1.DefaultSeatMinResidency
	if seat.MinResidency != nil {
		minResidency = seat.MinResidency.Duration
	}
	return map[string]any{
		"group":        seat.Group,
		"priority":     int64(seat.Priority),
		"minResidency": minResidency.String(),
	}
}

// ColdPath is where the node agent reads an application's cold copy, its
// weights in the model cache, relative to the agent's cold tier (its
// --cold-dir, where the chart mounts each such cache read-only under the
// application's name): "<app>/<file>". Empty when the agent cannot read
// it, and then a promotion ahead of a wake or a demotion never starts from
// the cold tier:
//   - the application does not sleep, or its cold tier is not the model
//     cache;
//   - the engine's weights are not one file of the cache: a simulator
//     with --weights-file=/models/<file>, or an Ollama or llama.cpp
//     application outside a seat group, whose GGUF (model.file) its
//     sidecar points it at in the hottest tier holding a verified copy
//     (ModelCopies); vLLM loads a directory of safetensors shards, which
//     the tiers (one file per application) do not hold;
//   - the cache is not a claim of the chart's that every node can mount
//     (accessMode ReadWriteMany): the agent runs on every node, and a
//     ReadWriteOnce claim attached to one node would keep the agent pods
//     of the other nodes from starting. A pvc:// source or an existing
//     claim is the user's: its access mode is not known.
func ColdPath(name string, app v1alpha1.Application, s Sleep) string {
	if app.Lifecycle == nil || (!s.Enabled() && app.Lifecycle.Seat == nil) {
		return ""
	}
	if s.Tiers.Cold != v1alpha1.ColdTierModelCache {
		return ""
	}
	c := app.Model.Cache
	if strings.HasPrefix(app.Model.Source, "pvc://") || c == nil || c.ExistingClaim != "" || c.AccessMode != corev1.ReadWriteMany {
		return ""
	}
	var file string
	switch app.Runtime.Engine {
	case v1alpha1.EngineSimulator:
		file = weightsFile(app)
	case v1alpha1.EngineOllama, v1alpha1.EngineLlamaCPP:
		if !hasSeat(app) {
			file = cacheFile(app.Model.File)
		}
	}
	if file == "" {
		return ""
	}
	return path.Join(name, file)
}

// cacheFile is a model file inside the cache, cleaned; empty when it is
// none or leaves the cache.
func cacheFile(f string) string {
	if f == "" {
		return ""
	}
	f = path.Clean(f)
	if f == "." || f == ".." || strings.HasPrefix(f, "../") || strings.HasPrefix(f, "/") {
		return ""
	}
	return f
}

// weightsFile is the simulator's --weights-file inside the model cache
// (/models/<file>), cleaned; empty when it has none or it leaves the cache.
func weightsFile(app v1alpha1.Application) string {
	var file string
	for _, a := range app.Runtime.Args {
		if f, ok := strings.CutPrefix(a, "--weights-file=/models/"); ok {
			file = path.Clean(f)
		}
	}
	if file == "." || file == ".." || strings.HasPrefix(file, "../") {
		return ""
	}
	return file
}

// ColdS3 is the S3 object the node agent reads as an application's cold
// copy, as the chart's lifecycle.sleep.coldS3 value: the agent gets it as
// an S3 source named for the application (--cold-s3) with the Secret
// mounted, and the leader names the source with each wake and a
// demotion's fallback.
type ColdS3 struct {
	// URL is s3://<bucket>/<key> of the weights file.
	URL string
	// Endpoint and Region are the model's s3 settings.
	Endpoint, Region string
	// CredentialsSecret is the model's credentialsSecretRef.
	CredentialsSecret string
}

// values is c as the chart's lifecycle.sleep.coldS3 value; an empty
// endpoint (AWS) or region (asked from the bucket) is left out.
func (c ColdS3) values() map[string]any {
	v := map[string]any{"url": c.URL, "credentialsSecret": c.CredentialsSecret}
	if c.Endpoint != "" {
		v["endpoint"] = c.Endpoint
	}
	if c.Region != "" {
		v["region"] = c.Region
	}
	return v
}

// ColdS3Location is where the node agent reads an application's cold copy
// when its cold tier is S3, or why it cannot: a message naming the
// application and the field, for the CheckpointFieldsSupported condition.
// Both are empty when the application does not sleep (nor shares a seat)
// or its cold tier is not S3. The agent can read it when all of these hold:
//   - the model's source is s3://<bucket>[/<prefix>]: the cold copy is the
//     object the fetch Job downloads into the cache;
//   - the engine is the simulator with --weights-file=/models/<file>: the
//     tiers hold the simulator's weights, and only then are they that
//     object's bytes (<prefix>/<file>), so its digest verifies the copy;
//   - the model has a credentialsSecretRef: the agent, shared by the
//     node's applications, reads the bucket with the application's own
//     Secret, never with a cloud identity of its own.
func ColdS3Location(name string, app v1alpha1.Application, s Sleep) (ColdS3, string) {
	if app.Lifecycle == nil || (!s.Enabled() && app.Lifecycle.Seat == nil) || s.Tiers.Cold != v1alpha1.ColdTierS3 {
		return ColdS3{}, ""
	}
	m := app.Model
	rest, ok := strings.CutPrefix(m.Source, "s3://")
	if !ok {
		return ColdS3{}, fmt.Sprintf("%s: tiers.cold is S3, but model.source %q is not an s3:// source: the node agent reads the cold copy from the model's bucket; use tiers.cold ModelCache", name, m.Source)
	}
	if app.Runtime.Engine != v1alpha1.EngineSimulator {
		return ColdS3{}, fmt.Sprintf("%s: tiers.cold is S3, but runtime.engine is %s: the node tiers hold only the simulator's weights (--weights-file), so the agent has no copy of %s's to read from S3; a cold wake reads the model cache", name, app.Runtime.Engine, app.Runtime.Engine)
	}
	file := weightsFile(app)
	if file == "" || strings.ContainsAny(file, ", ") {
		return ColdS3{}, fmt.Sprintf("%s: tiers.cold is S3, but runtime.args have no --weights-file=/models/<file> (a path inside the model cache, without commas or spaces): with synthetic weights there is no object to read", name)
	}
	if m.CredentialsSecretRef == nil || m.CredentialsSecretRef.Name == "" {
		return ColdS3{}, fmt.Sprintf("%s: tiers.cold is S3, but model.credentialsSecretRef is not set: the node agent reads the bucket with the application's Secret (%s, %s), never with a cloud identity", name, s3cred.AccessKeyName, s3cred.SecretKeyName)
	}
	bucket, prefix, _ := strings.Cut(rest, "/")
	key := file
	if prefix = strings.Trim(prefix, "/"); prefix != "" {
		key = prefix + "/" + file
	}
	c := ColdS3{URL: "s3://" + bucket + "/" + key, CredentialsSecret: m.CredentialsSecretRef.Name}
	if m.S3 != nil {
		c.Endpoint, c.Region = m.S3.Endpoint, m.S3.Region
	}
	if strings.ContainsAny(key+c.Endpoint+c.Region, ", ") {
		return ColdS3{}, fmt.Sprintf("%s: tiers.cold is S3, but the object s3://%s/%s or model.s3 holds a comma or a space, which the node agent's --cold-s3 cannot carry", name, bucket, key)
	}
	return c, ""
}

// Level1Tier is where a level-1 sleep leaves the weights that the engine's
// wake reads: the simulator and vLLM keep them in RAM (the node agent's hot
// tier, or vLLM's offload to its own process's memory); Ollama and
// llama.cpp unload the model completely, and their wake reads the model
// cache again, unless they load copies (ModelCopies): then the leader
// takes the tier from their sidecars, and Cold is the fallback.
func Level1Tier(e v1alpha1.Engine) v1alpha1.Tier {
	switch e {
	case v1alpha1.EngineOllama, v1alpha1.EngineLlamaCPP:
		return v1alpha1.TierCold
	default:
		return v1alpha1.TierHot
	}
}
