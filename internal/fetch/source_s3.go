package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// s3Source reads every object under a prefix of an S3-compatible bucket.
type s3Source struct {
	client *minio.Client
	bucket string
	prefix string
}

func newS3Source(cfg Config, ps ParsedSource, transport http.RoundTripper) (*s3Source, error) {
	endpoint, secure := "s3.amazonaws.com", true
	if cfg.S3Endpoint != "" {
		u, err := url.Parse(cfg.S3Endpoint)
		if err != nil {
			return nil, fmt.Errorf("%w: --s3-endpoint: %w", ErrInvalidConfig, err)
		}
		endpoint, secure = u.Host, u.Scheme == "https"
	}
	var creds *credentials.Credentials
	if cfg.S3AccessKeyFile != "" {
		ak, err := os.ReadFile(cfg.S3AccessKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: reading S3 access key: %w", ErrInvalidConfig, err)
		}
		sk, err := os.ReadFile(cfg.S3SecretKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: reading S3 secret key: %w", ErrInvalidConfig, err)
		}
		creds = credentials.NewStaticV4(strings.TrimSpace(string(ak)), strings.TrimSpace(string(sk)), "")
	} else {
		creds = credentials.NewChainCredentials([]credentials.Provider{
			&credentials.EnvAWS{}, &credentials.EnvMinio{},
			&credentials.FileAWSCredentials{}, &credentials.IAM{Client: &http.Client{Transport: transport}},
		})
	}
	client, err := minio.New(endpoint, &minio.Options{
		Creds:      creds,
		Secure:     secure,
		Region:     cfg.S3Region,
		Transport:  transport,
		MaxRetries: 1, // the downloader retries with its own backoff
	})
	if err != nil {
		return nil, fmt.Errorf("%w: S3 client: %w", ErrInvalidConfig, err)
	}
	return &s3Source{client: client, bucket: ps.Bucket, prefix: ps.Prefix}, nil
}

// s3Err turns a minio error response into the package's classification.
func s3Err(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	resp := minio.ToErrorResponse(err)
	switch {
	case resp.StatusCode != 0:
		return fmt.Errorf("%w (%s)", &statusError{Code: resp.StatusCode, What: what}, resp.Code)
	case resp.Code == "NoSuchKey" || resp.Code == "NoSuchBucket":
		return fmt.Errorf("%s: %w: %s", what, ErrNotFound, resp.Message)
	case resp.Code == "AccessDenied":
		return fmt.Errorf("%s: %w: %s", what, ErrAccessDenied, resp.Message)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (s *s3Source) List(ctx context.Context) ([]RemoteFile, string, error) {
	prefix := s.prefix
	if prefix != "" && !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	what := fmt.Sprintf("listing s3://%s/%s", s.bucket, prefix)
	var files []RemoteFile
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, "", s3Err(obj.Err, what)
		}
		if strings.HasSuffix(obj.Key, "/") {
			continue // directory marker
		}
		rel := strings.TrimPrefix(obj.Key, prefix)
		if err := safeRelPath(rel); err != nil {
			return nil, "", permanent(fmt.Errorf("%s: %w", what, err))
		}
		files = append(files, RemoteFile{Path: rel, Size: obj.Size, ETag: strings.Trim(obj.ETag, `"`), key: obj.Key})
	}
	if len(files) == 0 {
		return nil, "", fmt.Errorf("%s: %w: no objects", what, ErrNotFound)
	}
	return files, "", nil
}

func (s *s3Source) OpenRange(ctx context.Context, f RemoteFile, off, length int64) (io.ReadCloser, error) {
	what := "downloading " + f.Path
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+length-1); err != nil {
		return nil, permanent(fmt.Errorf("%s: %w", what, err))
	}
	if f.ETag != "" {
		// The object must not change between chunks.
		if err := opts.SetMatchETag(f.ETag); err != nil {
			return nil, permanent(fmt.Errorf("%s: %w", what, err))
		}
	}
	obj, err := s.client.GetObject(ctx, s.bucket, f.key, opts)
	if err != nil {
		return nil, s3Err(err, what)
	}
	return &s3Body{obj: obj, r: io.LimitReader(obj, length), what: what}, nil
}

type s3Body struct {
	obj  *minio.Object
	r    io.Reader
	what string
}

func (b *s3Body) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = s3Err(err, b.what)
	}
	return n, err
}

func (b *s3Body) Close() error { return b.obj.Close() }
