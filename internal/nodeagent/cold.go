package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/fetch/s3cred"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// ColdSource is where a promotion reads an artifact's cold copy.
type ColdSource interface {
	// Open returns the cold copy's bytes and their number.
	Open(ctx context.Context) (io.ReadCloser, int64, error)
	// Kind is ColdModelCache or ColdS3.
	Kind() string
	// String names the copy (a path, or s3://bucket/key).
	String() string
}

// ColdFile is a cold copy in a mounted model cache.
type ColdFile string

// Open opens the file.
func (f ColdFile) Open(context.Context) (io.ReadCloser, int64, error) {
	fh, err := os.Open(string(f))
	if err != nil {
		return nil, 0, fmt.Errorf("opening the cold copy: %w", err)
	}
	fi, err := fh.Stat()
	if err != nil {
		_ = fh.Close() // read-only; the stat error is returned
		return nil, 0, fmt.Errorf("opening the cold copy: %w", err)
	}
	return fh, fi.Size(), nil
}

// Kind is ColdModelCache.
func (ColdFile) Kind() string     { return nodeapi.ColdModelCache }
func (f ColdFile) String() string { return string(f) }

// ColdS3Source is an S3 object the node agent may copy as the cold copy of
// an application's weights (--cold-s3), under the application's name: a
// promotion names the source (coldS3), never a bucket, an endpoint or
// credentials, so the agent reads only the objects it was configured with.
type ColdS3Source struct {
	// Name is the application's.
	Name string `json:"name"`
	// URL is s3://<bucket>/<key>.
	URL string `json:"url"`
	// Endpoint of an S3-compatible store (http://minio:9000); empty is
	// AWS S3. Region empty asks the bucket.
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
	// Credentials is a directory holding the files s3cred.AccessKeyName
	// and s3cred.SecretKeyName (the application's credentials Secret,
	// mounted); empty uses the agent's environment or cloud identity.
	Credentials string `json:"credentials,omitempty"`
	// Transport overrides the HTTP transport (tests).
	Transport http.RoundTripper `json:"-"`
}

// ErrNoColdCredentials means an S3 cold source's credentials directory
// lacks a key file: the Secret it mounts is missing or incomplete.
var ErrNoColdCredentials = errors.New("no S3 credentials")

// ParseColdS3Source reads the --cold-s3 form
// name=<app>,url=s3://<bucket>/<key>[,endpoint=<url>][,region=<r>][,credentials=<dir>];
// Validate checks it.
func ParseColdS3Source(s string) (ColdS3Source, error) {
	var c ColdS3Source
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return c, fmt.Errorf("cold S3 source %q: %q is not key=value", s, kv)
		}
		switch k {
		case "name":
			c.Name = v
		case "url":
			c.URL = v
		case "endpoint":
			c.Endpoint = v
		case "region":
			c.Region = v
		case "credentials":
			c.Credentials = v
		default:
			return c, fmt.Errorf("cold S3 source %q: unknown key %q (want name, url, endpoint, region, credentials)", s, k)
		}
	}
	return c, nil
}

// Validate checks the name, the URL and the endpoint.
func (c ColdS3Source) Validate() error {
	var errs []error
	if c.Name == "" || strings.ContainsAny(c.Name, "/,=") {
		errs = append(errs, fmt.Errorf("cold S3 source %q: name must be set, without / , or =", c.Name))
	}
	if _, err := c.object(); err != nil {
		errs = append(errs, fmt.Errorf("cold S3 source %s: %w", c.Name, err))
	}
	if c.Endpoint != "" && !strings.HasPrefix(c.Endpoint, "http://") && !strings.HasPrefix(c.Endpoint, "https://") {
		errs = append(errs, fmt.Errorf("cold S3 source %s: endpoint %q must be an http(s) URL", c.Name, c.Endpoint))
	}
	return errors.Join(errs...)
}

// object is the fetcher's address of the source.
func (c ColdS3Source) object() (fetch.S3Object, error) {
	ps, err := fetch.ParseSource(c.URL, "")
	if err != nil {
		return fetch.S3Object{}, err
	}
	if ps.Kind != fetch.KindS3 || ps.Prefix == "" || strings.HasSuffix(ps.Prefix, "/") {
		return fetch.S3Object{}, fmt.Errorf("url %q must be s3://<bucket>/<key> of one object", c.URL)
	}
	o := fetch.S3Object{Endpoint: c.Endpoint, Region: c.Region, Bucket: ps.Bucket, Key: ps.Prefix}
	if c.Credentials != "" {
		o.AccessKeyFile = filepath.Join(c.Credentials, s3cred.AccessKeyName)
		o.SecretKeyFile = filepath.Join(c.Credentials, s3cred.SecretKeyName)
	}
	return o, nil
}

// Open reads the whole object. Credentials that cannot be read (the
// Secret is missing, or lacks a key) fail before any request.
func (c ColdS3Source) Open(ctx context.Context) (io.ReadCloser, int64, error) {
	o, err := c.object()
	if err != nil {
		return nil, 0, err
	}
	if c.Credentials != "" {
		for _, f := range []string{o.AccessKeyFile, o.SecretKeyFile} {
			if _, err := os.Stat(f); err != nil {
				return nil, 0, fmt.Errorf("reading the cold copy of %s from %s: %w: %s is missing (the application's model.credentialsSecretRef Secret, mounted at %s, must exist and hold %s and %s)",
					c.Name, o, ErrNoColdCredentials, f, c.Credentials, s3cred.AccessKeyName, s3cred.SecretKeyName)
			}
		}
	}
	body, n, err := fetch.OpenS3Object(ctx, o, c.Transport)
	if err != nil {
		return nil, 0, fmt.Errorf("reading the cold copy of %s: %w", c.Name, err)
	}
	return body, n, nil
}

// Kind is ColdS3.
func (ColdS3Source) Kind() string { return nodeapi.ColdS3 }

func (c ColdS3Source) String() string {
	o, err := c.object()
	if err != nil {
		return c.URL
	}
	return o.String()
}

// coldReport is the node report's entry for c, before any copy: the
// model cache mount is one source, each S3 source is its own by name.
func coldReport(c ColdSource) nodeapi.ColdReport {
	source := nodeapi.ColdModelCache
	if s3, ok := c.(ColdS3Source); ok {
		source = s3.Name
	}
	return nodeapi.ColdReport{Source: source, Kind: c.Kind(), Location: c.String()}
}

// coldRead is a ColdSource that remembers when it was opened, so that a
// promotion that read it can be measured.
type coldRead struct {
	ColdSource
	opened time.Time
}

func (c *coldRead) Open(ctx context.Context) (io.ReadCloser, int64, error) {
	c.opened = time.Now()
	return c.ColdSource.Open(ctx)
}

// SHA256 is the manifest sha256 the source verifies against, if any.
func (c *coldRead) SHA256() string { return manifestSHA256(c.ColdSource) }
