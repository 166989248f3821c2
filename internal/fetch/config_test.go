package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
)

func TestParseSource(t *testing.T) {
	tests := []struct {
		src, rev string
		want     ParsedSource
		wantErr  string
	}{
		{src: "hf://org/repo", want: ParsedSource{Kind: KindHF, Repo: "org/repo", Revision: "main"}},
		{src: "hf://org/repo@v1.0", want: ParsedSource{Kind: KindHF, Repo: "org/repo", Revision: "v1.0"}},
		{src: "hf://org/repo", rev: "abc", want: ParsedSource{Kind: KindHF, Repo: "org/repo", Revision: "abc"}},
		{src: "hf://org/repo@a", rev: "b", wantErr: "--revision"},
		{src: "hf://org/repo@", wantErr: "empty revision"},
		{src: "hf://repo-only", wantErr: "org/name"},
		{src: "hf://org/../x", wantErr: "org/name"},
		{src: "https://host/dir/m.gguf", want: ParsedSource{Kind: KindHTTPS, URL: "https://host/dir/m.gguf"}},
		{src: "https://host/", wantErr: "must name a file"},
		{src: "s3://bucket/some/prefix", want: ParsedSource{Kind: KindS3, Bucket: "bucket", Prefix: "some/prefix"}},
		{src: "s3://B_ad/x", wantErr: "bucket"},
		{src: "pvc://claim/a/b/../c", want: ParsedSource{Kind: KindPVC, Claim: "claim", Prefix: "a/c"}},
		{src: "pvc://claim", want: ParsedSource{Kind: KindPVC, Claim: "claim"}},
		{src: "pvc://Bad_Claim/x", wantErr: "claim"},
		{src: "ftp://x/y", wantErr: "unsupported"},
		{src: "org/repo", wantErr: "want hf://"},
	}
	for _, tc := range tests {
		t.Run(tc.src+"@"+tc.rev, func(t *testing.T) {
			got, err := ParseSource(tc.src, tc.rev)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	valid := func() Config {
		c := Default()
		c.Source, c.Dest = "hf://org/repo", "/models/app"
		return c
	}
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr []string
	}{
		{"defaults with source and dest", func(*Config) {}, nil},
		{"no source", func(c *Config) { c.Source = "" }, []string{"--source is required"}},
		{"relative dest", func(c *Config) { c.Dest = "models" }, []string{"absolute"}},
		{"no dest", func(c *Config) { c.Dest = "" }, []string{"--dest is required"}},
		{"pvc needs no dest", func(c *Config) { c.Source, c.Dest = "pvc://claim/m", "" }, nil},
		{"pre-converted needs no source", func(c *Config) { c.Source, c.PreConverted = "", true }, nil},
		{"bad glob", func(c *Config) { c.Include = []string{"[a"} }, []string{"glob"}},
		{"bad format", func(c *Config) { c.Format = "onnx" }, []string{"--format"}},
		{"sha256 on hf", func(c *Config) { c.SHA256 = strings.Repeat("a", 64) }, []string{"only applies to https"}},
		{"bad sha256", func(c *Config) { c.Source, c.SHA256 = "https://h/f", "xyz" }, []string{"64 hex"}},
		{"revision on s3", func(c *Config) { c.Source, c.Revision = "s3://bucket/p", "v1" }, []string{"--revision only"}},
		{"bad endpoint", func(c *Config) { c.HFEndpoint = "mirror:8080" }, []string{"hub endpoint"}},
		{"half s3 keys", func(c *Config) { c.S3AccessKeyFile = "/a" }, []string{"go together"}},
		{"several problems at once", func(c *Config) { c.Concurrency, c.ChunkSize, c.StallTimeout = 0, 10, 0 },
			[]string{"--concurrency", "--chunk-size", "--stall-timeout"}},
		{"configmap without namespace", func(c *Config) { c.ProgressConfigMap = "p" }, []string{"--progress-namespace"}},
		{"configmap with namespace", func(c *Config) { c.ProgressConfigMap, c.ProgressNamespace = "p", "ns" }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := valid()
			tc.mutate(&c)
			err := c.Validate()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidConfig) || ExitCode(err) != ExitBadInput {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestFlags(t *testing.T) {
	c := Default()
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	BindFlags(fs, &c)
	err := fs.Parse([]string{"--source", "hf://o/r", "--dest", "/m", "--include", "*.gguf", "--include", "*.json",
		"--chunk-size", "16MiB", "--concurrency", "3", "--exclude", "x*", "--verify-sha256=false"})
	if err != nil {
		t.Fatal(err)
	}
	if c.ChunkSize != 16<<20 || c.Concurrency != 3 || len(c.Include) != 2 || c.Exclude[0] != "x*" || c.VerifySHA256 {
		t.Errorf("parsed config = %+v", c)
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"64MiB": 64 << 20, "1GiB": 1 << 30, "512KiB": 512 << 10, "10MB": 10e6, "1048576": 1 << 20, "2G": 2 << 30} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5GiB", "99999999999TiB"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
		}
	}
}

func TestExitCodes(t *testing.T) {
	tests := []struct {
		err  error
		want int
	}{
		{nil, ExitOK},
		{fmt.Errorf("x: %w", ErrInvalidConfig), ExitBadInput},
		{&statusError{Code: http.StatusNotFound}, ExitBadInput},
		{&statusError{Code: http.StatusForbidden}, ExitBadInput},
		{fmt.Errorf("%w: f", ErrVerification), ExitVerification},
		{fmt.Errorf("write: %w", syscall.ENOSPC), ExitNoSpace},
		{fmt.Errorf("%w: x: %w", ErrGaveUp, &statusError{Code: 503}), ExitNetwork},
		{context.Canceled, ExitCanceled},
		{errors.New("boom"), ExitInternal},
	}
	for _, tc := range tests {
		if got := ExitCode(tc.err); got != tc.want {
			t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&statusError{Code: 503}, true},
		{&statusError{Code: 429}, true},
		{&statusError{Code: 404}, false},
		{&statusError{Code: 401}, false},
		{errors.New("connection reset"), true},
		{fmt.Errorf("%w", ErrNoSpace), false},
		{permanent(errors.New("bad range")), false},
	} {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestSafeRelPath(t *testing.T) {
	for _, p := range []string{"../x", "/abs", "a/../../b", "a//b", ".orchestra/manifest.json", "a\\b", ""} {
		if safeRelPath(p) == nil {
			t.Errorf("safeRelPath(%q) accepted", p)
		}
	}
	for _, p := range []string{"a", "dir/file.bin", ".gitattributes"} {
		if err := safeRelPath(p); err != nil {
			t.Errorf("safeRelPath(%q): %v", p, err)
		}
	}
}
