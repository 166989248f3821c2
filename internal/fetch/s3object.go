package fetch

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/minio/minio-go/v7"
)

// S3Object is one object of an S3-compatible store and how to reach it,
// as a fetch of an s3:// source reaches its bucket.
type S3Object struct {
	// Endpoint is the store's URL (http://minio:9000); empty is AWS S3.
	Endpoint string
	// Region of the bucket; empty asks the bucket.
	Region string
	// AccessKeyFile and SecretKeyFile hold the credentials; without them
	// they come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or MINIO_*),
	// else IAM.
	AccessKeyFile string
	SecretKeyFile string
	Bucket        string
	Key           string
}

// String is the object's address, s3://bucket/key (with the endpoint).
func (o S3Object) String() string {
	if o.Endpoint != "" {
		return fmt.Sprintf("s3://%s/%s (endpoint %s)", o.Bucket, o.Key, o.Endpoint)
	}
	return fmt.Sprintf("s3://%s/%s", o.Bucket, o.Key)
}

// OpenS3Object opens the whole of o with the fetcher's S3 client and
// returns its body and size. The body is pinned to the object's ETag, so
// an object replaced while it is read fails the read rather than mixing
// two versions. Errors are classified as a fetch's: ErrNotFound (no such
// bucket or key), ErrAccessDenied (the credentials were refused),
// ErrInvalidConfig (unreadable key files, a bad endpoint). transport may be
// nil (the default).
func OpenS3Object(ctx context.Context, o S3Object, transport http.RoundTripper) (io.ReadCloser, int64, error) {
	if transport == nil {
		transport = http.DefaultTransport
	}
	cfg := Config{S3Endpoint: o.Endpoint, S3Region: o.Region, S3AccessKeyFile: o.AccessKeyFile, S3SecretKeyFile: o.SecretKeyFile}
	src, err := newS3Source(cfg, ParsedSource{Kind: KindS3, Bucket: o.Bucket, Prefix: o.Key}, transport)
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", o, err)
	}
	st, err := src.client.StatObject(ctx, o.Bucket, o.Key, minio.StatObjectOptions{})
	if err != nil {
		return nil, 0, s3Err(err, "reading "+o.String())
	}
	if st.Size <= 0 {
		return nil, 0, fmt.Errorf("reading %s: %w: the object is empty", o, ErrNotFound)
	}
	body, err := src.OpenRange(ctx, RemoteFile{Path: o.String(), Size: st.Size, ETag: st.ETag, key: o.Key}, 0, st.Size)
	if err != nil {
		return nil, 0, err
	}
	return body, st.Size, nil
}
