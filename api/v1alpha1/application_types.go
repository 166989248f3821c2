package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Application is one served model.
//
// +kubebuilder:validation:XValidation:rule="self.runtime.engine != 'dllama' || [1, 2, 4, 8, 16, 32, 64].exists(n, n == self.runtime.workers + 1)",message="distributed-llama needs root plus workers to be a power of two: workers must be 0, 1, 3, 7, 15, 31 or 63",fieldPath=".runtime.workers"
// +kubebuilder:validation:XValidation:rule="self.runtime.workers == 0 || self.runtime.engine in ['llamacpp', 'dllama', 'vllm']",message="workers are supported by the llamacpp, dllama and vllm engines only",fieldPath=".runtime.workers"
// +kubebuilder:validation:XValidation:rule="!has(self.model.format) || self.runtime.engine == 'simulator' || (self.runtime.engine in ['llamacpp', 'ollama'] && self.model.format == 'gguf') || (self.runtime.engine == 'dllama' && self.model.format == 'dllama') || (self.runtime.engine == 'vllm' && self.model.format in ['safetensors', 'gguf']) || (self.runtime.engine in ['llamacpp', 'ollama'] && self.model.format == 'safetensors' && has(self.model.convert))",message="format does not fit the engine: llamacpp and ollama load gguf (or safetensors with model.convert), dllama loads dllama, vllm loads safetensors or gguf",fieldPath=".model.format"
// +kubebuilder:validation:XValidation:rule="!has(self.model.convert) || self.runtime.engine in ['llamacpp', 'ollama', 'simulator']",message="model.convert writes a GGUF file: only the llamacpp and ollama engines (and the simulator) load it",fieldPath=".model.convert"
// +kubebuilder:validation:XValidation:rule="!(self.runtime.engine in ['llamacpp', 'ollama', 'dllama'] || (self.runtime.engine == 'vllm' && has(self.model.format) && self.model.format == 'gguf')) || has(self.model.file) || has(self.model.convert)",message="file is required: the engine loads one model file (for example model-Q4_K_M.gguf)",fieldPath=".model.file"
// +kubebuilder:validation:XValidation:rule="self.runtime.engine != 'dllama' || has(self.model.tokenizerFile)",message="tokenizerFile is required by the dllama engine",fieldPath=".model.tokenizerFile"
// +kubebuilder:validation:XValidation:rule="self.runtime.engine != 'vllm' || self.runtime.workers == 0 || self.model.source.startsWith('pvc://') || (has(self.model.cache) && (has(self.model.cache.existingClaim) || (has(self.model.cache.accessMode) && self.model.cache.accessMode == 'ReadWriteMany')))",message="multi-node vllm reads the model on every node: set cache.accessMode ReadWriteMany, an existingClaim or a pvc:// source",fieldPath=".model.cache"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.sleepAfter) || self.runtime.engine != 'dllama'",message="distributed-llama cannot sleep (it has no sleep or unload API): remove lifecycle.sleepAfter",fieldPath=".lifecycle.sleepAfter"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.checkpointPolicy) || self.runtime.engine != 'dllama'",message="distributed-llama cannot sleep (it has no sleep or unload API): remove lifecycle.checkpointPolicy",fieldPath=".lifecycle.checkpointPolicy"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.seat) || self.runtime.engine != 'dllama'",message="distributed-llama cannot share an accelerator seat (it cannot sleep to free it): remove lifecycle.seat",fieldPath=".lifecycle.seat"
// +kubebuilder:validation:XValidation:rule="!has(self.lifecycle) || !has(self.lifecycle.maxReplicas) || self.lifecycle.maxReplicas <= 1 || self.model.source.startsWith('pvc://') || !has(self.model.cache) || !has(self.model.cache.accessMode) || self.model.cache.accessMode != 'ReadWriteOncePod'",message="lifecycle.maxReplicas above 1 needs a model cache that several pods can mount: a ReadWriteOncePod claim admits one pod; use ReadWriteOnce or ReadWriteMany",fieldPath=".lifecycle.maxReplicas"
type Application struct {
	// model is what to serve and where it comes from.
	// +required
	Model ModelSpec `json:"model"`

	// runtime is the inference engine and where it runs.
	// +optional
	// +kubebuilder:default={}
	Runtime RuntimeSpec `json:"runtime,omitempty"`

	// serving is how the model is offered to clients.
	// +optional
	// +kubebuilder:default={}
	Serving ServingSpec `json:"serving,omitempty"`

	// scaling is how many copies of the topology run.
	// +optional
	// +kubebuilder:default={}
	Scaling ScalingSpec `json:"scaling,omitempty"`

	// lifecycle scales the application with its demand, down to zero pods
	// when idle; without it scaling.replicas is the fixed size, which it
	// then replaces.
	// +optional
	Lifecycle *LifecycleSpec `json:"lifecycle,omitempty"`
}

// ModelFormat is the on-disk format of the model files.
// +kubebuilder:validation:Enum=gguf;safetensors;dllama
type ModelFormat string

// Model formats.
const (
	ModelFormatGGUF        ModelFormat = "gguf"
	ModelFormatSafetensors ModelFormat = "safetensors"
	ModelFormatDllama      ModelFormat = "dllama"
)

// ModelSpec says which model to serve and where it comes from.
//
// The claim the operator creates for the cache (no pvc:// source, no
// existingClaim) keeps its storage class and access mode: a
// PersistentVolumeClaim cannot change them. Its size is not checked here
// (a quantity rule inside the applications map exceeds the CEL cost
// budget): a smaller size fails the upgrade with the API server's message.
//
// +kubebuilder:validation:XValidation:rule="self.source.startsWith('pvc://') || (has(self.cache) && has(self.cache.existingClaim)) || oldSelf.source.startsWith('pvc://') || (has(oldSelf.cache) && has(oldSelf.cache.existingClaim)) || (has(self.cache) && has(self.cache.accessMode) ? self.cache.accessMode : 'ReadWriteOnce') == (has(oldSelf.cache) && has(oldSelf.cache.accessMode) ? oldSelf.cache.accessMode : 'ReadWriteOnce')",message="cache.accessMode cannot be changed in place: the access mode of a PersistentVolumeClaim is immutable; use a new application name, or an existingClaim",fieldPath=".cache.accessMode"
// +kubebuilder:validation:XValidation:rule="self.source.startsWith('pvc://') || (has(self.cache) && has(self.cache.existingClaim)) || oldSelf.source.startsWith('pvc://') || (has(oldSelf.cache) && has(oldSelf.cache.existingClaim)) || (has(self.cache) && has(self.cache.storageClassName) ? self.cache.storageClassName : '(default)') == (has(oldSelf.cache) && has(oldSelf.cache.storageClassName) ? oldSelf.cache.storageClassName : '(default)')",message="cache.storageClassName cannot be changed in place: the storage class of a PersistentVolumeClaim is immutable; use a new application name, or an existingClaim",fieldPath=".cache.storageClassName"
//
// +kubebuilder:validation:XValidation:rule="!self.source.startsWith('pvc://') || !has(self.cache)",message="a pvc:// source is read in place from its claim: remove cache",fieldPath=".cache"
// +kubebuilder:validation:XValidation:rule="!self.source.startsWith('pvc://') || (!has(self.include) && !has(self.exclude) && !has(self.tokenSecretRef))",message="include, exclude and tokenSecretRef apply to downloaded models, not to a pvc:// source"
// +kubebuilder:validation:XValidation:rule="!has(self.tokenSecretRef) || self.source.startsWith('hf://') || self.source.startsWith('https://')",message="tokenSecretRef is used for hf:// and https:// sources; s3:// sources take credentials from credentialsSecretRef",fieldPath=".tokenSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.credentialsSecretRef) || self.source.startsWith('s3://')",message="credentialsSecretRef is used for s3:// sources only",fieldPath=".credentialsSecretRef"
// +kubebuilder:validation:XValidation:rule="!has(self.s3) || self.source.startsWith('s3://')",message="s3 is used for s3:// sources only",fieldPath=".s3"
// +kubebuilder:validation:XValidation:rule="!has(self.sha256) || self.source.startsWith('https://')",message="sha256 checks a single https:// file",fieldPath=".sha256"
// +kubebuilder:validation:XValidation:rule="!has(self.convert) || !self.source.startsWith('pvc://')",message="convert writes the GGUF file into the model cache: a pvc:// source is read in place; download it (hf://, https://, s3://) or convert it beforehand",fieldPath=".convert"
type ModelSpec struct {
	// source of the model files:
	// hf://<org>/<repo>[@<revision>] (a Hugging Face repository),
	// https://<host>/<path> (one file),
	// s3://<bucket>/<prefix> (an S3-compatible bucket), or
	// pvc://<claim>/<path> (files already on a PersistentVolumeClaim in the
	// resource's namespace, used in place without a download).
	// +required
	// +kubebuilder:validation:MinLength=6
	// +kubebuilder:validation:MaxLength=1024
	// +kubebuilder:validation:XValidation:rule="self.matches('^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[-A-Za-z0-9_.]+(@[^ @]+)?|https://[^ /]+/[^ ]*|s3://[a-z0-9][-a-z0-9.]*[a-z0-9](/[^ ]*)?|pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?(/[^ ]*)?)$')",message="source must be hf://<org>/<repo>[@<revision>], https://<host>/<path>, s3://<bucket>[/<prefix>] or pvc://<claim>[/<path>]"
	Source string `json:"source"`

	// include are glob patterns of the files to download (for example
	// "*.Q4_K_M.gguf"); empty downloads every file.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Include []string `json:"include,omitempty"`

	// exclude are glob patterns of files not to download, applied after
	// include.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	Exclude []string `json:"exclude,omitempty"`

	// hubEndpoint is the base URL of a Hugging Face-compatible hub or mirror
	// that hf:// sources are downloaded from instead of
	// https://huggingface.co, as HF_ENDPOINT sets it for the Hugging Face
	// tools; for example http://hf-mirror.models.svc:8080. The fetch pod
	// must reach it. Only used with hf:// sources.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:Pattern=`^https?://[^ ]+$`
	HubEndpoint string `json:"hubEndpoint,omitempty"`

	// tokenSecretRef is a Secret key holding the access token for a private
	// Hugging Face repository or an https:// source (sent as a bearer token).
	// +optional
	TokenSecretRef *SecretKeyRef `json:"tokenSecretRef,omitempty"`

	// credentialsSecretRef names a Secret with the keys AWS_ACCESS_KEY_ID
	// and AWS_SECRET_ACCESS_KEY for s3:// sources; without it the fetcher
	// uses the pod's cloud identity.
	// +optional
	CredentialsSecretRef *corev1.LocalObjectReference `json:"credentialsSecretRef,omitempty"`

	// s3 locates an S3-compatible store for s3:// sources.
	// +optional
	S3 *S3Spec `json:"s3,omitempty"`

	// sha256 is the expected SHA-256 digest (hex) of an https:// file; the
	// download fails on a mismatch.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-f0-9]{64}$`
	SHA256 string `json:"sha256,omitempty"`

	// format of the model files. Defaults to the engine's native format:
	// gguf for llamacpp and ollama, dllama for dllama, safetensors for vllm.
	// A model already converted for distributed-llama has format dllama.
	// +optional
	Format ModelFormat `json:"format,omitempty"`

	// file is the model file the engine loads, relative to the model
	// directory (for gguf and dllama models). With convert it names the
	// converted GGUF file, by default model-<weightType>.gguf.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.contains('..')",message="file must be a relative path inside the model directory"
	File string `json:"file,omitempty"`

	// tokenizerFile is the distributed-llama tokenizer file (.t) relative to
	// the model directory.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="!self.startsWith('/') && !self.contains('..')",message="tokenizerFile must be a relative path inside the model directory"
	TokenizerFile string `json:"tokenizerFile,omitempty"`

	// convert asks for a conversion after the download: a Hugging Face
	// llama-family checkpoint (config.json, *.safetensors shards,
	// tokenizer.json and tokenizer_config.json with a byte-level BPE
	// tokenizer) becomes one GGUF file in the cache, which the llamacpp or
	// ollama engine then loads. An unsupported checkpoint fails the fetch
	// with a message naming what is missing (status
	// applications.<app>.model.message, ModelReady False).
	// +optional
	Convert *ModelConvert `json:"convert,omitempty"`

	// sizing checks, for the llamacpp and ollama engines, that the model
	// fits the engine container's memory limit before the engine starts:
	// after the fetch (and conversion) the model file's GGUF header gives
	// the weights and the memory for serving.contextLength tokens ×
	// serving.maxConcurrency sequences; if that plus the margin exceeds
	// runtime.resources.limits.memory, the fetch fails, ModelReady is False
	// with reason ModelTooLarge and the numbers, and engine pods wait in
	// their init container instead of starting into an out-of-memory kill.
	// The size is published in status.applications.<app>.model.size either
	// way.
	// +optional
	Sizing *ModelSizing `json:"sizing,omitempty"`

	// cache is the PersistentVolumeClaim the model is downloaded to once
	// and read from by every replica. Without it a 20Gi ReadWriteOnce claim
	// of the default storage class is used.
	// +optional
	Cache *CacheSpec `json:"cache,omitempty"`
}

// S3Spec locates an S3-compatible object store.
type S3Spec struct {
	// endpoint URL of an S3-compatible store, for example
	// http://minio.storage:9000; empty uses AWS S3.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^ ]+$`
	Endpoint string `json:"endpoint,omitempty"`

	// region of the bucket; empty asks the bucket.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Region string `json:"region,omitempty"`
}

// SecretKeyRef selects a key of a Secret in the resource's namespace.
type SecretKeyRef struct {
	// name of the Secret.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`

	// key in the Secret.
	// +optional
	// +kubebuilder:default=token
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
}

// CacheSpec is the model cache volume.
//
// +kubebuilder:validation:XValidation:rule="!has(self.existingClaim) || (!has(self.size) && !has(self.storageClassName) && !has(self.accessMode))",message="existingClaim uses a claim you manage: remove size, storageClassName and accessMode",fieldPath=".existingClaim"
type CacheSpec struct {
	// size of the claim; it must hold the model files. Defaults to 20Gi.
	// Once the claim exists it can only grow, and only when its storage
	// class allows volume expansion; otherwise the upgrade fails.
	// +optional
	Size *resource.Quantity `json:"size,omitempty"`

	// storageClassName of the claim; empty uses the cluster's default class.
	// It cannot be changed once the claim exists.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	StorageClassName string `json:"storageClassName,omitempty"`

	// accessMode of the claim. ReadWriteOnce (the default) lets all pods on
	// one node share it; ReadWriteMany is needed when replicas or vLLM
	// workers run on several nodes. It cannot be changed once the claim
	// exists.
	// +optional
	// +kubebuilder:validation:Enum=ReadWriteOnce;ReadWriteMany;ReadWriteOncePod
	AccessMode corev1.PersistentVolumeAccessMode `json:"accessMode,omitempty"`

	// existingClaim is a claim in the resource's namespace to download the
	// model into instead of a claim created by the operator.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	ExistingClaim string `json:"existingClaim,omitempty"`
}
