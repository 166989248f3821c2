package orchestra

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/version"
)

// TranslatorName is the values translator's name in watches.yaml.
const TranslatorName = "modelorchestra"

// Image is one image the chart references, overridable by an environment
// variable of the operator (set by OLM from the CSV's relatedImages).
type Image struct {
	// Key is the key under the chart's global.images value.
	Key string
	// Env is the environment variable that overrides Default.
	Env string
	// Default is used when Env is unset or empty.
	Default string
}

// Images are the images of the stack. The engines' defaults are upstream
// images; the project's own are built with the operator at its version.
func Images() []Image {
	return []Image{
		{Key: "gateway", Env: "RELATED_IMAGE_GATEWAY", Default: version.Image("orchestra-gateway")},
		{Key: "dispatcher", Env: "RELATED_IMAGE_DISPATCHER", Default: version.Image("orchestra-dispatcher")},
		{Key: "fetch", Env: "RELATED_IMAGE_FETCH", Default: version.Image("orchestra-fetch")},
		{Key: "sim", Env: "RELATED_IMAGE_SIM", Default: version.Image("orchestra-sim")},
		{Key: "agent", Env: "RELATED_IMAGE_AGENT", Default: version.Image("orchestra-agent")},
		{Key: "nats", Env: "RELATED_IMAGE_NATS", Default: version.Image("nats-server")},
		{Key: "llamacpp", Env: "RELATED_IMAGE_LLAMACPP", Default: "ghcr.io/ggml-org/llama.cpp:full"},
		{Key: "dllama", Env: "RELATED_IMAGE_DLLAMA", Default: "ghcr.io/b4rtaz/distributed-llama:v0.16.2"},
		{Key: "vllm", Env: "RELATED_IMAGE_VLLM", Default: "docker.io/vllm/vllm-openai:v0.11.0"},
		{Key: "ollama", Env: "RELATED_IMAGE_OLLAMA", Default: "docker.io/ollama/ollama:0.17.4"},
	}
}

// Defaults of fields without a schema default, documented in the API.
var (
	defaultCacheSize          = resource.MustParse("20Gi")
	defaultNATSStorageSize    = resource.MustParse("10Gi")
	defaultGatewayResources   = requirements("100m", "128Mi", "512Mi")
	defaultDispatcherResource = requirements("50m", "64Mi", "256Mi")
	defaultNATSResources      = requirements("100m", "256Mi", "1Gi")
)

func requirements(cpu, memory, memoryLimit string) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse(cpu),
			corev1.ResourceMemory: resource.MustParse(memory),
		},
		Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(memoryLimit)},
	}
}

// Translator turns a ModelOrchestra into the values of the model-orchestra
// umbrella chart (shared values under global, each subchart's under its
// name): the spec with defaults filled in, images resolved and the fields
// the binaries need in their own units (for example bytes, label selector
// strings).
type Translator struct {
	// Getenv reads the image overrides; nil means os.Getenv.
	Getenv func(string) string
}

// Translate implements plugin.Translator. The CheckpointPolicies the
// applications reference are read through plugin.ReaderFrom(ctx); one that
// cannot be read leaves its applications with their inline fields (the
// status plugin reports it), so that a missing policy never fails the
// release.
func (t Translator) Translate(ctx context.Context, obj *unstructured.Unstructured) (map[string]any, error) {
	mo, err := Decode(obj)
	if err != nil {
		return nil, err
	}
	if errs := validation.Spec(&mo.Spec); len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s %q: %w", validation.ErrInvalid, v1alpha1.Kind, mo.Name, errs.ToAggregate())
	}
	gates, err := sizingGates(ctx, plugin.ReaderFrom(ctx), mo)
	if err != nil {
		return nil, err
	}
	return t.values(mo, resolvePolicies(ctx, plugin.ReaderFrom(ctx), mo), gates)
}

// crdDefaults applies the CRD schema's defaults; built once from the
// embedded CRD.
var crdDefaults = sync.OnceValues(func() (*validation.Validator, error) {
	return validation.New(operator.ModelOrchestraCRD(), v1alpha1.GroupVersion.Version)
})

// Decode converts obj to a ModelOrchestra with every default applied: the
// CRD schema's (exactly as the API server applies them, so that a resource
// that did not pass through it, such as a stored object from before a new
// default, is treated alike) and those that depend on other fields and so
// live in code (see Default). Unknown fields are refused.
func Decode(obj *unstructured.Unstructured) (*v1alpha1.ModelOrchestra, error) {
	v, err := crdDefaults()
	if err != nil {
		return nil, fmt.Errorf("loading the ModelOrchestra schema: %w", err)
	}
	defaulted := v.Default(obj)
	var mo v1alpha1.ModelOrchestra
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(defaulted.Object, &mo, true); err != nil {
		return nil, fmt.Errorf("decoding %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	Default(&mo)
	return &mo, nil
}

// Default fills the defaults that depend on other fields, which the CRD
// schema cannot express: the served model name (the application name),
// the model format (the engine's own), the model cache (20Gi
// ReadWriteOnce, unless the source is pvc://), secret keys, the in-cluster
// NATS volume (10Gi), and distributed-llama's concurrency of one.
func Default(mo *v1alpha1.ModelOrchestra) {
	s := &mo.Spec
	for name, app := range s.Applications {
		rt := &app.Runtime
		if app.Serving.ServedModelName == "" {
			app.Serving.ServedModelName = name
		}
		if rt.Engine == v1alpha1.EngineDllama {
			// dllama-api answers one request at a time.
			app.Serving.MaxConcurrency = 1
		}
		defaultLifecycle(&app)
		if c := app.Model.Convert; c != nil {
			if c.WeightType == "" {
				c.WeightType = v1alpha1.ConvertQ8_0
			}
			if app.Model.Format == "" {
				app.Model.Format = v1alpha1.ModelFormatSafetensors
			}
			if app.Model.File == "" {
				app.Model.File = "model-" + string(c.WeightType) + ".gguf"
			}
		}
		if app.Model.Format == "" {
			app.Model.Format = nativeFormat(rt.Engine)
		}
		if app.Model.TokenSecretRef != nil && app.Model.TokenSecretRef.Key == "" {
			app.Model.TokenSecretRef.Key = "token"
		}
		if !strings.HasPrefix(app.Model.Source, "pvc://") {
			if app.Model.Cache == nil {
				app.Model.Cache = &v1alpha1.CacheSpec{}
			}
			c := app.Model.Cache
			if c.ExistingClaim == "" {
				if c.Size == nil {
					size := defaultCacheSize.DeepCopy()
					c.Size = &size
				}
				if c.AccessMode == "" {
					c.AccessMode = corev1.ReadWriteOnce
				}
			}
		}
		s.Applications[name] = app
	}
	if s.Gateway.Auth.HMACKeySecretRef != nil && s.Gateway.Auth.HMACKeySecretRef.Key == "" {
		s.Gateway.Auth.HMACKeySecretRef.Key = "token"
	}
	if s.NATS.URL == "" && s.NATS.Storage == nil {
		s.NATS.Storage = &v1alpha1.VolumeSpec{}
	}
	if s.NATS.Storage != nil && s.NATS.Storage.Size.IsZero() {
		s.NATS.Storage.Size = defaultNATSStorageSize.DeepCopy()
	}
}

func (t Translator) values(mo *v1alpha1.ModelOrchestra, pols policies, gates map[string]sizingGate) (map[string]any, error) {
	getenv := t.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	images := map[string]any{}
	for _, img := range Images() {
		v := strings.TrimSpace(getenv(img.Env))
		if v == "" {
			v = img.Default
		}
		images[img.Key] = v
	}

	s := mo.Spec
	pullSecrets := make([]any, 0, len(s.ImagePullSecrets))
	for _, ps := range s.ImagePullSecrets {
		pullSecrets = append(pullSecrets, map[string]any{"name": ps.Name})
	}

	gateway, err := gatewayValues(s.Gateway)
	if err != nil {
		return nil, err
	}
	apps := map[string]any{}
	sleeping := false
	var sleepers []string // the applications the node agent serves
	for name, app := range s.Applications {
		sleep := effectiveSleep(app, pols)
		if sleep.Enabled() || hasSeat(app) {
			sleeping = true
			sleepers = append(sleepers, name)
		}
		v, err := applicationValues(app, sleep)
		if err != nil {
			return nil, fmt.Errorf("spec.applications[%s]: %w", name, err)
		}
		if lc, ok := v["lifecycle"].(map[string]any); ok {
			if s, ok := lc["sleep"].(map[string]any); ok {
				s["level1Tier"] = string(Level1Tier(app.Runtime.Engine))
			}
		}
		if p := ColdPath(name, app, sleep); p != "" {
			v["lifecycle"].(map[string]any)["sleep"].(map[string]any)["coldPath"] = p
		}
		if ModelCopies(name, app, sleep) {
			v["lifecycle"].(map[string]any)["sleep"].(map[string]any)["modelCopies"] = true
		}
		if c, why := ColdS3Location(name, app, sleep); why == "" && c.URL != "" {
			v["lifecycle"].(map[string]any)["sleep"].(map[string]any)["coldS3"] = c.values()
		}
		if g := gates[name]; g.Hold {
			// No engine pod until the model is known to fit (sizinggate.go).
			v["engineHold"] = map[string]any{"refused": g.Refused}
		}
		apps[name] = v
	}

	// What several subcharts read is under global; each subchart's own
	// settings are under its name.
	nats := map[string]any{
		"url":       natsURL(mo),
		"inCluster": s.NATS.URL == "",
		"replicas":  int64(s.NATS.Replicas),
	}
	if r := s.NATS.CredentialsSecretRef; r != nil {
		nats["credentialsSecretRef"] = map[string]any{"name": r.Name}
	}
	natsServer := map[string]any{
		"enabled":   s.NATS.URL == "",
		"resources": toMap(orDefault(s.NATS.Resources, defaultNATSResources)),
		"storage":   natsStorage(defaultNATSStorageSize, ""),
	}
	if st := s.NATS.Storage; st != nil {
		natsServer["storage"] = natsStorage(st.Size, st.StorageClassName)
	}

	global := map[string]any{
		"images":           images,
		"imagePullSecrets": pullSecrets,
		"nats":             nats,
		"applications":     apps,
		// The gateway's direct lane: the gateway renders it per model,
		// the engines' NetworkPolicy admits the gateway for it.
		"directLane": s.Gateway.DirectLaneEnabled(),
	}
	if sleeping {
		// The node agent owns the hot and warm tiers of sleeping engines.
		global["agent"] = map[string]any{"enabled": true}
	}
	if len(s.SeatGroups) > 0 {
		global["seatGroups"] = seatGroupValues(s.SeatGroups)
	}
	agent, err := agentValues(s, sleepers)
	if err != nil {
		return nil, err
	}
	return map[string]any{
		"global":  global,
		"nats":    natsServer,
		"gateway": gateway,
		"agent":   agent,
		"dispatcher": map[string]any{
			"replicas":  int64(s.Dispatcher.Replicas),
			"resources": toMap(orDefault(s.Dispatcher.Resources, defaultDispatcherResource)),
			"owner":     ownerValues(mo),
		},
	}, nil
}

func gatewayValues(g v1alpha1.GatewaySpec) (map[string]any, error) {
	selector := ""
	if !g.Auth.Anonymous {
		selector = v1alpha1.DefaultTokenSecretSelector
		if g.Auth.TokenSecretSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(g.Auth.TokenSecretSelector)
			if err != nil {
				return nil, fmt.Errorf("spec.gateway.auth.tokenSecretSelector: %w", err)
			}
			if sel.Empty() {
				return nil, fmt.Errorf("spec.gateway.auth.tokenSecretSelector: an empty selector would accept every Secret in the namespace as a token")
			}
			selector = sel.String()
		}
	}
	hmac := map[string]any{"name": "", "key": "token"}
	if r := g.Auth.HMACKeySecretRef; r != nil {
		hmac = map[string]any{"name": r.Name, "key": r.Key}
	}
	maxBody, ok := g.Limits.MaxBodySize.AsInt64()
	if !ok || maxBody <= 0 {
		return nil, fmt.Errorf("spec.gateway.limits.maxBodySize: %s is not a positive whole number of bytes", g.Limits.MaxBodySize.String())
	}
	if err := checkMaxBodySize(maxBody); err != nil {
		return nil, err
	}
	annotations := map[string]any{}
	for k, v := range g.Service.Annotations {
		annotations[k] = v
	}
	out := map[string]any{
		"replicas": int64(g.Replicas),
		"service": map[string]any{
			"type":        string(g.Service.Type),
			"port":        int64(g.Service.Port),
			"nodePort":    int64(g.Service.NodePort),
			"annotations": annotations,
		},
		"ingress":   map[string]any{"enabled": false},
		"httpRoute": map[string]any{"enabled": false},
		"auth": map[string]any{
			"anonymous":        g.Auth.Anonymous,
			"secretSelector":   selector,
			"hmacKeySecretRef": hmac,
		},
		"limits": map[string]any{
			"requestsPerMinute": int64(g.Limits.RequestsPerMinute),
			"tokensPerMinute":   int64(g.Limits.TokensPerMinute),
			"maxConcurrent":     int64(g.Limits.MaxConcurrent),
			"maxBodyBytes":      maxBody,
		},
		"resources": toMap(orDefault(g.Resources, defaultGatewayResources)),
	}
	if r := g.Responses.Retention; r != nil {
		if r.Duration < time.Minute {
			return nil, fmt.Errorf("spec.gateway.responses.retention: %s is shorter than a minute", r.Duration)
		}
		out["responses"] = map[string]any{"retention": r.Duration.String()}
	}
	if in := g.Ingress; in != nil {
		ann := map[string]any{}
		for k, v := range in.Annotations {
			ann[k] = v
		}
		out["ingress"] = map[string]any{
			"enabled":       true,
			"className":     in.ClassName,
			"host":          in.Host,
			"path":          in.Path,
			"tlsSecretName": in.TLSSecretName,
			"annotations":   ann,
		}
	}
	if r := g.HTTPRoute; r != nil {
		refs := make([]any, 0, len(r.ParentRefs))
		for _, p := range r.ParentRefs {
			refs = append(refs, map[string]any{"name": p.Name, "namespace": p.Namespace, "sectionName": p.SectionName})
		}
		hosts := make([]any, 0, len(r.Hostnames))
		for _, h := range r.Hostnames {
			hosts = append(hosts, h)
		}
		out["httpRoute"] = map[string]any{"enabled": true, "parentRefs": refs, "hostnames": hosts, "path": r.Path}
	}
	return out, nil
}

func applicationValues(app v1alpha1.Application, sleep Sleep) (map[string]any, error) {
	m := app.Model
	model := map[string]any{
		"source":        m.Source,
		"include":       strings2any(m.Include),
		"exclude":       strings2any(m.Exclude),
		"format":        string(m.Format),
		"file":          m.File,
		"tokenizerFile": m.TokenizerFile,
		"sha256":        m.SHA256,
		"hubEndpoint":   m.HubEndpoint,
	}
	if c := m.Convert; c != nil {
		model["convert"] = map[string]any{"weightType": string(c.WeightType)}
	}
	if sz := sizingValues(app); sz != nil {
		model["sizing"] = sz
	}
	if r := m.TokenSecretRef; r != nil {
		model["tokenSecretRef"] = map[string]any{"name": r.Name, "key": r.Key}
	}
	if r := m.CredentialsSecretRef; r != nil {
		model["credentialsSecretRef"] = map[string]any{"name": r.Name}
	}
	if s3 := m.S3; s3 != nil {
		model["s3"] = map[string]any{"endpoint": s3.Endpoint, "region": s3.Region}
	}
	if c := m.Cache; c != nil {
		cache := map[string]any{
			"storageClassName": c.StorageClassName,
			"accessMode":       string(c.AccessMode),
			"existingClaim":    c.ExistingClaim,
		}
		if c.Size != nil {
			cache["size"] = c.Size.String()
		}
		model["cache"] = cache
	}

	rt := app.Runtime
	runtimeValues := map[string]any{
		"engine":          string(rt.Engine),
		"image":           rt.Image,
		"imagePullPolicy": string(rt.ImagePullPolicy),
		"args":            strings2any(rt.Args),
		"workers":         int64(rt.Workers),
		"gpu":             map[string]any{"count": int64(rt.GPU.Count), "product": rt.GPU.Product},
	}
	if rt.RunAsUser != nil {
		runtimeValues["runAsUser"] = *rt.RunAsUser
	}
	if rt.RunAsGroup != nil {
		runtimeValues["runAsGroup"] = *rt.RunAsGroup
	}
	if len(rt.Env) > 0 {
		env, err := toJSONValue(rt.Env)
		if err != nil {
			return nil, fmt.Errorf("runtime.env: %w", err)
		}
		runtimeValues["env"] = env
	}
	if rt.Resources != nil {
		runtimeValues["resources"] = toMap(*rt.Resources)
	}
	if len(rt.NodeSelector) > 0 {
		ns := map[string]any{}
		for k, v := range rt.NodeSelector {
			ns[k] = v
		}
		runtimeValues["nodeSelector"] = ns
	}
	if len(rt.Tolerations) > 0 {
		tol, err := toJSONValue(rt.Tolerations)
		if err != nil {
			return nil, fmt.Errorf("runtime.tolerations: %w", err)
		}
		runtimeValues["tolerations"] = tol
	}
	if rt.Affinity != nil {
		aff, err := toJSONValue(rt.Affinity)
		if err != nil {
			return nil, fmt.Errorf("runtime.affinity: %w", err)
		}
		runtimeValues["affinity"] = aff
	}

	sv := app.Serving
	serving := map[string]any{
		"servedModelName": sv.ServedModelName,
		"maxConcurrency":  int64(sv.MaxConcurrency),
		"contextLength":   int64(sv.ContextLength),
		"warmupPrompts":   strings2any(sv.WarmupPrompts),
		"routing":         string(sv.Routing),
	}
	out := map[string]any{
		"model":   model,
		"runtime": runtimeValues,
		"serving": serving,
		"scaling": map[string]any{"replicas": int64(app.Scaling.Replicas)},
	}
	if app.Lifecycle != nil {
		out["lifecycle"] = lifecycleValues(app.Lifecycle, sleep)
	}
	return out, nil
}

func orDefault(r *corev1.ResourceRequirements, def corev1.ResourceRequirements) corev1.ResourceRequirements {
	if r == nil {
		return def
	}
	return *r
}

// toMap converts resource requirements to plain values (quantities as
// strings), dropping empty parts.
func toMap(r corev1.ResourceRequirements) map[string]any {
	out := map[string]any{}
	list := func(l corev1.ResourceList) map[string]any {
		m := make(map[string]any, len(l))
		for k, q := range l {
			m[string(k)] = q.String()
		}
		return m
	}
	if len(r.Requests) > 0 {
		out["requests"] = list(r.Requests)
	}
	if len(r.Limits) > 0 {
		out["limits"] = list(r.Limits)
	}
	return out
}

func strings2any(in []string) []any {
	out := make([]any, 0, len(in))
	for _, s := range in {
		out = append(out, s)
	}
	return out
}

// toJSONValue converts a Kubernetes API value to plain JSON values.
func toJSONValue(v any) (any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// natsURL is the URL every NATS client of mo connects to, the one place
// that decides it: spec.nats.url, or else the client Service of the
// in-cluster server, which the nats part names "<release>-nats" (the
// release is named after the resource) and serves on port 4222. The chart
// prints it (global.nats.url) and computes nothing.
func natsURL(mo *v1alpha1.ModelOrchestra) string {
	if mo.Spec.NATS.URL != "" {
		return mo.Spec.NATS.URL
	}
	return fmt.Sprintf("nats://%s-nats.%s.svc:4222", mo.Name, mo.Namespace)
}

// natsStorage is the nats subchart's storage value: the volume size as a Kubernetes
// quantity, and the same size in bytes for JetStream's max_file_store, whose
// parser knows neither binary suffixes (Gi) nor the other quantity forms.
func natsStorage(size resource.Quantity, storageClassName string) map[string]any {
	return map[string]any{
		"size":              size.String(),
		"maxFileStoreBytes": size.Value(),
		"storageClassName":  storageClassName,
	}
}
