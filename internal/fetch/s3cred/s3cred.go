// Package s3cred names the two S3 credentials a fetch uses: the environment
// variables a fetch reads when it is given no key files, the keys of the
// Secret a model's credentialsSecretRef names, and so the files of that
// Secret mounted as a credentials directory (fetch.S3Object.AccessKeyFile
// and SecretKeyFile). It is its own package so that the operator, which
// checks the Secret, does not link the S3 client.
package s3cred

const (
	AccessKeyName = "AWS_ACCESS_KEY_ID"
	SecretKeyName = "AWS_SECRET_ACCESS_KEY"
)
