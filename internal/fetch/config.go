package fetch

import (
	"github.com/model-orchestra/operator/internal/convert"

	"errors"
	"fmt"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Source kinds understood by Config.Source.
const (
	KindHF    = "hf"
	KindHTTPS = "https"
	KindS3    = "s3"
	KindPVC   = "pvc"
)

// Formats understood by Config.Format.
const (
	FormatGGUF        = "gguf"
	FormatSafetensors = "safetensors"
	FormatDllama      = "dllama"
)

// DefaultHFEndpoint is used when neither --hf-endpoint nor HF_ENDPOINT is set.
const DefaultHFEndpoint = "https://huggingface.co"

// Config is everything one orchestra-fetch run needs. Build it with Default,
// change what the user asked for, then call Validate.
type Config struct {
	// Source is hf://org/repo[@rev], https://host/file, s3://bucket/prefix or
	// pvc://claim/path.
	Source string
	// Dest is the cache directory the files are published into.
	Dest string
	// Revision overrides the @rev of an hf:// source (branch, tag or commit).
	Revision string
	// Include and Exclude are path.Match globs on the file path relative to
	// the repository root; a glob without "/" also matches the base name.
	Include []string
	Exclude []string
	// Format, when set, is checked after download: gguf, safetensors or dllama.
	Format string
	// Convert, when set, converts the fetched Hugging Face llama checkpoint
	// to a GGUF file of this weight type (F16, Q8_0 or Q4_0) in Dest.
	Convert string
	// ConvertOutput is the converted file's name relative to Dest (default
	// model-<type>.gguf).
	ConvertOutput string
	// SizeFile, when set, is the GGUF file (relative to the model
	// directory) whose header is read after the fetch and conversion to
	// publish the model's size and the memory it needs for SizeContext
	// tokens (0: the model's own) × SizeParallel sequences. With
	// MemoryLimit the estimate plus MemoryMargin percent must fit, or the
	// run fails (unless IgnoreMemoryLimit). With GPUs the estimate
	// offloads every layer to that many GPUs; with a GPUProduct of known
	// memory (modelsize.GPUMemory) the fullest GPU's estimate plus the
	// margin must fit it too.
	SizeFile          string
	SizeContext       int64
	SizeParallel      int64
	MemoryLimit       int64
	MemoryMargin      int64
	IgnoreMemoryLimit bool
	GPUs              int64
	GPUProduct        string

	// HFEndpoint is the hub base URL (HF_ENDPOINT). Token is the bearer token;
	// TokenFile, when set, is read at start and wins over HF_TOKEN.
	HFEndpoint string
	TokenFile  string
	Token      string `json:"-"`

	// SHA256 is the expected digest of an https:// single file (optional).
	SHA256 string

	// S3 settings. Credentials come from the key files when set, else from
	// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or MINIO_*), else IAM.
	S3Endpoint      string
	S3Region        string
	S3AccessKeyFile string
	S3SecretKeyFile string

	// PVCRoot is where pvc://claim/path claims are mounted (<root>/<claim>)
	// when Dest is not given.
	PVCRoot string
	// PreConverted marks Dest as already holding the model: nothing is
	// downloaded, the files are verified and sized.
	PreConverted bool

	Concurrency int
	ChunkSize   int64
	// MaxAttempts is how many consecutive attempts without progress one
	// range gets before the run gives up.
	MaxAttempts    int
	RequestTimeout time.Duration
	StallTimeout   time.Duration
	BackoffBase    time.Duration
	BackoffMax     time.Duration
	// MinFreeBytes is kept free on the cache filesystem on top of the bytes
	// still to download.
	MinFreeBytes int64

	// VerifySHA256 hashes every file; off only for trusted sources and the
	// benchmark.
	VerifySHA256 bool
	// Refresh asks the source again even when the manifest says the cache is
	// complete; VerifyExisting re-hashes files already in the cache.
	Refresh        bool
	VerifyExisting bool

	ProgressConfigMap string
	ProgressNamespace string
	ProgressInterval  time.Duration
	// ProgressBar draws a bar on stderr; main turns it on for a terminal.
	ProgressBar bool
}

// Default returns the configuration used when no flag is given.
func Default() Config {
	return Config{
		HFEndpoint:       DefaultHFEndpoint,
		PVCRoot:          "/mnt/pvc",
		Concurrency:      8,
		ChunkSize:        64 << 20,
		MaxAttempts:      8,
		RequestTimeout:   30 * time.Second,
		StallTimeout:     60 * time.Second,
		BackoffBase:      time.Second,
		BackoffMax:       time.Minute,
		MinFreeBytes:     64 << 20,
		VerifySHA256:     true,
		ProgressInterval: 5 * time.Second,
	}
}

// ApplyEnv fills the values that come from the environment when the flags
// left them unset: HF_ENDPOINT, HF_TOKEN / HUGGING_FACE_HUB_TOKEN.
func (c *Config) ApplyEnv(getenv func(string) string) {
	if ep := getenv("HF_ENDPOINT"); ep != "" && (c.HFEndpoint == "" || c.HFEndpoint == DefaultHFEndpoint) {
		c.HFEndpoint = ep
	}
	if c.Token == "" && c.TokenFile == "" {
		c.Token = firstNonEmpty(getenv("HF_TOKEN"), getenv("HUGGING_FACE_HUB_TOKEN"))
	}
}

func firstNonEmpty(v ...string) string {
	for _, s := range v {
		if s != "" {
			return s
		}
	}
	return ""
}

// ParsedSource is Config.Source taken apart.
type ParsedSource struct {
	Kind string
	// Repo is org/repo (hf), Bucket the S3 bucket, Claim the PVC name.
	Repo, Bucket, Claim string
	// Revision is the hf revision ("main" when absent).
	Revision string
	// Prefix is the S3 key prefix or the path inside the claim.
	Prefix string
	// URL is the https:// address.
	URL string
}

var (
	hfRepoRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$`)
	sha256RE  = regexp.MustCompile(`^[0-9a-f]{64}$`)
	bucketRE  = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$`)
	dns1123RE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// ParseSource splits a source reference. revision, when non-empty, overrides
// the @rev of an hf:// source.
func ParseSource(src, revision string) (ParsedSource, error) {
	scheme, rest, ok := strings.Cut(src, "://")
	if !ok {
		return ParsedSource{}, fmt.Errorf("source %q: want hf://, https://, s3:// or pvc://", src)
	}
	switch scheme {
	case KindHF:
		repo, rev, hasRev := strings.Cut(rest, "@")
		if hasRev && rev == "" {
			return ParsedSource{}, fmt.Errorf("source %q: empty revision after @", src)
		}
		if !hfRepoRE.MatchString(repo) || strings.Contains(repo, "..") {
			return ParsedSource{}, fmt.Errorf("source %q: repository must be org/name", src)
		}
		if revision != "" {
			if hasRev && rev != revision {
				return ParsedSource{}, fmt.Errorf("source %q names revision %q but --revision is %q", src, rev, revision)
			}
			rev = revision
		}
		if rev == "" {
			rev = "main"
		}
		return ParsedSource{Kind: KindHF, Repo: repo, Revision: rev}, nil
	case "https", "http":
		u, err := url.Parse(src)
		if err != nil || u.Host == "" {
			return ParsedSource{}, fmt.Errorf("source %q: not a valid URL", src)
		}
		if path.Base(u.Path) == "/" || path.Base(u.Path) == "." || u.Path == "" {
			return ParsedSource{}, fmt.Errorf("source %q: the URL must name a file", src)
		}
		return ParsedSource{Kind: KindHTTPS, URL: src}, nil
	case KindS3:
		bucket, prefix, _ := strings.Cut(rest, "/")
		if !bucketRE.MatchString(bucket) {
			return ParsedSource{}, fmt.Errorf("source %q: invalid bucket name %q", src, bucket)
		}
		return ParsedSource{Kind: KindS3, Bucket: bucket, Prefix: prefix}, nil
	case KindPVC:
		claim, p, _ := strings.Cut(rest, "/")
		if !dns1123RE.MatchString(claim) || len(claim) > 253 {
			return ParsedSource{}, fmt.Errorf("source %q: invalid claim name %q", src, claim)
		}
		p = path.Clean("/" + p)[1:]
		return ParsedSource{Kind: KindPVC, Claim: claim, Prefix: p}, nil
	default:
		return ParsedSource{}, fmt.Errorf("source %q: unsupported scheme %q", src, scheme)
	}
}

// Validate reports every problem with c at once. The error wraps
// ErrInvalidConfig.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	var ps ParsedSource
	switch {
	case c.Source == "" && !c.PreConverted:
		bad("--source is required (or --pre-converted with --dest)")
	case c.Source != "":
		var err error
		if ps, err = ParseSource(c.Source, c.Revision); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Dest == "" && ps.Kind != KindPVC {
		bad("--dest is required")
	}
	if c.Dest != "" && !filepath.IsAbs(c.Dest) {
		bad("--dest %q must be an absolute path", c.Dest)
	}
	if c.Revision != "" && ps.Kind != "" && ps.Kind != KindHF {
		bad("--revision only applies to hf:// sources")
	}
	for _, g := range append(append([]string{}, c.Include...), c.Exclude...) {
		if _, err := path.Match(g, ""); err != nil {
			bad("glob %q: %v", g, err)
		}
	}
	switch c.Format {
	case "", FormatGGUF, FormatSafetensors, FormatDllama:
	default:
		bad("--format %q: want gguf, safetensors or dllama", c.Format)
	}
	if c.Convert != "" {
		if _, err := convert.ParseType(c.Convert); err != nil {
			bad("--convert: %v", err)
		}
		if c.Dest == "" {
			bad("--convert writes into the cache: it needs --dest (a pvc:// source is read in place)")
		}
		if c.ConvertOutput != "" && (filepath.IsAbs(c.ConvertOutput) || !filepath.IsLocal(c.ConvertOutput)) {
			bad("--convert-output %q must be a relative path inside --dest", c.ConvertOutput)
		}
	}
	if c.SizeFile != "" && (filepath.IsAbs(c.SizeFile) || !filepath.IsLocal(c.SizeFile)) {
		bad("--size-file %q must be a relative path inside the model directory", c.SizeFile)
	}
	if c.SizeContext < 0 || c.SizeParallel < 0 || c.MemoryLimit < 0 || c.MemoryMargin < 0 || c.GPUs < 0 {
		bad("--size-context, --size-parallel, --memory-limit, --memory-margin and --gpus cannot be negative")
	}
	if c.GPUProduct != "" && c.GPUs == 0 {
		bad("--gpu-product needs --gpus of at least 1")
	}
	if c.SHA256 != "" {
		if !sha256RE.MatchString(strings.ToLower(c.SHA256)) {
			bad("--sha256 must be 64 hex digits")
		}
		if ps.Kind != "" && ps.Kind != KindHTTPS {
			bad("--sha256 only applies to https:// sources")
		}
	}
	if ps.Kind == KindHF {
		if u, err := url.Parse(c.HFEndpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("hub endpoint %q must be an http(s) URL", c.HFEndpoint)
		}
	}
	if c.S3Endpoint != "" {
		if u, err := url.Parse(c.S3Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("--s3-endpoint %q must be an http(s) URL", c.S3Endpoint)
		}
	}
	if (c.S3AccessKeyFile == "") != (c.S3SecretKeyFile == "") {
		bad("--s3-access-key-file and --s3-secret-key-file go together")
	}
	if c.Concurrency < 1 || c.Concurrency > 256 {
		bad("--concurrency %d: want 1..256", c.Concurrency)
	}
	if c.ChunkSize < 1<<20 || c.ChunkSize > 4<<30 {
		bad("--chunk-size %d: want 1MiB..4GiB", c.ChunkSize)
	}
	if c.MaxAttempts < 1 {
		bad("--max-attempts must be at least 1")
	}
	for name, d := range map[string]time.Duration{
		"--request-timeout": c.RequestTimeout, "--stall-timeout": c.StallTimeout,
		"--backoff-base": c.BackoffBase, "--backoff-max": c.BackoffMax,
		"--progress-interval": c.ProgressInterval,
	} {
		if d <= 0 {
			bad("%s must be positive", name)
		}
	}
	if c.BackoffMax < c.BackoffBase {
		bad("--backoff-max must not be below --backoff-base")
	}
	if c.MinFreeBytes < 0 {
		bad("--min-free must not be negative")
	}
	if c.ProgressConfigMap != "" {
		if !dns1123RE.MatchString(c.ProgressConfigMap) {
			bad("--progress-configmap %q is not a valid name", c.ProgressConfigMap)
		}
		if c.ProgressNamespace == "" {
			bad("--progress-namespace is required outside a pod (no service account namespace file)")
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// LoadSecrets reads the token and credential files named in c.
func (c *Config) LoadSecrets() error {
	if c.TokenFile != "" {
		b, err := os.ReadFile(c.TokenFile)
		if err != nil {
			return fmt.Errorf("%w: reading token file: %w", ErrInvalidConfig, err)
		}
		c.Token = strings.TrimSpace(string(b))
	}
	return nil
}

// ParseBytes reads sizes such as 64MiB, 1GiB, 512KiB, 10MB or 1048576.
func ParseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	if n > 0 && mult > 0 && n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q too large", s)
	}
	return n * mult, nil
}

// FormatBytes renders n with binary units, e.g. "1.5 GiB".
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
