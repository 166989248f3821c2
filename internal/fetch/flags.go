package fetch

import (
	"github.com/spf13/pflag"
)

// bytesValue is a pflag.Value accepting sizes such as 64MiB.
type bytesValue struct{ p *int64 }

func (b bytesValue) String() string {
	if b.p == nil {
		return ""
	}
	return FormatBytes(*b.p)
}
func (b bytesValue) Type() string { return "size" }
func (b bytesValue) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b.p = n
	return nil
}

// BindFlags registers the orchestra-fetch flags on fs, writing into c (whose
// current values are the defaults shown in --help).
func BindFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&c.Source, "source", c.Source, "model source: hf://org/repo[@rev], https://host/file, s3://bucket/prefix or pvc://claim/path")
	fs.StringVar(&c.Dest, "dest", c.Dest, "cache directory the model is published into (absolute)")
	fs.StringVar(&c.Revision, "revision", c.Revision, "hf:// revision (branch, tag or commit); default main")
	fs.StringArrayVar(&c.Include, "include", c.Include, "only fetch files matching this glob (repeatable; a glob without / matches base names)")
	fs.StringArrayVar(&c.Exclude, "exclude", c.Exclude, "skip files matching this glob (repeatable)")
	fs.StringVar(&c.Format, "format", c.Format, "check the result is a gguf, safetensors or dllama model")
	fs.StringVar(&c.Convert, "convert", c.Convert, "after the fetch, convert the Hugging Face llama checkpoint to a GGUF of this weight type: F16, Q8_0 or Q4_0")
	fs.StringVar(&c.ConvertOutput, "convert-output", c.ConvertOutput, "file name of the converted GGUF inside --dest (default model-<type>.gguf)")
	fs.StringVar(&c.SizeFile, "size-file", c.SizeFile, "GGUF file (relative to the model directory) whose header gives the size and memory estimate published after the fetch")
	fs.Int64Var(&c.SizeContext, "size-context", c.SizeContext, "context window per sequence for the memory estimate (0: the model's own)")
	fs.Int64Var(&c.SizeParallel, "size-parallel", c.SizeParallel, "sequences served at once, for the memory estimate")
	fs.Var(bytesValue{&c.MemoryLimit}, "memory-limit", "the engine's memory limit: fail when the estimate plus --memory-margin exceeds it (0: no check)")
	fs.Int64Var(&c.MemoryMargin, "memory-margin", c.MemoryMargin, "percent added to the memory estimate before comparing it with --memory-limit")
	fs.BoolVar(&c.IgnoreMemoryLimit, "ignore-memory-limit", c.IgnoreMemoryLimit, "publish the estimate but never fail on --memory-limit or the GPU memory")
	fs.Int64Var(&c.GPUs, "gpus", c.GPUs, "GPUs the engine offloads every layer to, for the memory estimate (0: CPU)")
	fs.StringVar(&c.GPUProduct, "gpu-product", c.GPUProduct, "GPU product (nvidia.com/gpu.product label value): fail when the estimate for one GPU plus --memory-margin exceeds its memory, where known")
	fs.StringVar(&c.HFEndpoint, "hf-endpoint", c.HFEndpoint, "Hugging Face compatible hub URL (env HF_ENDPOINT)")
	fs.StringVar(&c.TokenFile, "token-file", c.TokenFile, "file holding the hub bearer token (else env HF_TOKEN)")
	fs.StringVar(&c.SHA256, "sha256", c.SHA256, "expected sha256 of an https:// file")
	fs.StringVar(&c.S3Endpoint, "s3-endpoint", c.S3Endpoint, "S3-compatible endpoint URL, e.g. http://minio:9000 (default AWS)")
	fs.StringVar(&c.S3Region, "s3-region", c.S3Region, "S3 region (default: asked from the bucket)")
	fs.StringVar(&c.S3AccessKeyFile, "s3-access-key-file", c.S3AccessKeyFile, "file holding the S3 access key (else env AWS_ACCESS_KEY_ID)")
	fs.StringVar(&c.S3SecretKeyFile, "s3-secret-key-file", c.S3SecretKeyFile, "file holding the S3 secret key (else env AWS_SECRET_ACCESS_KEY)")
	fs.StringVar(&c.PVCRoot, "pvc-root", c.PVCRoot, "where pvc://claim/path claims are mounted when --dest is not given")
	fs.BoolVar(&c.PreConverted, "pre-converted", c.PreConverted, "--dest already holds the model: verify and size it, download nothing")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "parallel range requests")
	fs.Var(bytesValue{&c.ChunkSize}, "chunk-size", "bytes per range request (e.g. 64MiB)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", c.MaxAttempts, "attempts without progress per range before giving up")
	fs.DurationVar(&c.RequestTimeout, "request-timeout", c.RequestTimeout, "time to connect and receive response headers")
	fs.DurationVar(&c.StallTimeout, "stall-timeout", c.StallTimeout, "abort an attempt that receives no bytes for this long")
	fs.DurationVar(&c.BackoffBase, "backoff-base", c.BackoffBase, "first retry delay (doubles, with jitter)")
	fs.DurationVar(&c.BackoffMax, "backoff-max", c.BackoffMax, "longest retry delay")
	fs.Var(bytesValue{&c.MinFreeBytes}, "min-free", "space to leave free on the cache filesystem")
	fs.BoolVar(&c.VerifySHA256, "verify-sha256", c.VerifySHA256, "hash every file (turn off only for trusted sources)")
	fs.BoolVar(&c.Refresh, "refresh", c.Refresh, "ask the source again even if the cache is complete")
	fs.BoolVar(&c.VerifyExisting, "verify-existing", c.VerifyExisting, "re-hash cached files before trusting them")
	fs.StringVar(&c.ProgressConfigMap, "progress-configmap", c.ProgressConfigMap, "existing ConfigMap to write progress.json into")
	fs.StringVar(&c.ProgressNamespace, "progress-namespace", c.ProgressNamespace, "namespace of --progress-configmap (default: the pod's)")
	fs.DurationVar(&c.ProgressInterval, "progress-interval", c.ProgressInterval, "how often progress is logged and written")
}

// Summary is the effective configuration for --check-config: sizes and
// durations human-readable, secrets left out.
func (c Config) Summary() map[string]any {
	ps, _ := ParseSource(c.Source, c.Revision)
	return map[string]any{
		"source": c.Source, "sourceKind": ps.Kind, "repo": ps.Repo, "revision": ps.Revision,
		"bucket": ps.Bucket, "prefix": ps.Prefix, "claim": ps.Claim,
		"dest": c.Dest, "include": c.Include, "exclude": c.Exclude, "format": c.Format, "convert": c.Convert, "convertOutput": c.ConvertOutput,
		"sizeFile": c.SizeFile, "sizeContext": c.SizeContext, "sizeParallel": c.SizeParallel,
		"memoryLimit": c.MemoryLimit, "memoryMargin": c.MemoryMargin, "ignoreMemoryLimit": c.IgnoreMemoryLimit,
		"gpus": c.GPUs, "gpuProduct": c.GPUProduct,
		"hfEndpoint": c.HFEndpoint, "tokenFile": c.TokenFile, "tokenSet": c.Token != "",
		"sha256": c.SHA256, "s3Endpoint": c.S3Endpoint, "s3Region": c.S3Region,
		"s3AccessKeyFile": c.S3AccessKeyFile, "s3SecretKeyFile": c.S3SecretKeyFile,
		"pvcRoot": c.PVCRoot, "preConverted": c.PreConverted,
		"concurrency": c.Concurrency, "chunkSize": FormatBytes(c.ChunkSize), "maxAttempts": c.MaxAttempts,
		"requestTimeout": c.RequestTimeout.String(), "stallTimeout": c.StallTimeout.String(),
		"backoffBase": c.BackoffBase.String(), "backoffMax": c.BackoffMax.String(),
		"minFree": FormatBytes(c.MinFreeBytes), "verifySHA256": c.VerifySHA256,
		"refresh": c.Refresh, "verifyExisting": c.VerifyExisting,
		"progressConfigMap": c.ProgressConfigMap, "progressNamespace": c.ProgressNamespace,
		"progressInterval": c.ProgressInterval.String(),
	}
}
