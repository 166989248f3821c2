package nodeapi

// The node agent's copies on disk, as the sidecar reads them: a copy of
// an artifact is the file <tier dir>/<namespace>/<name>, and beside it
// the metadata file CopyMetaName(name), written once the copy is
// complete and verified. A sidecar points its engine only at a copy whose
// metadata records the size and sha256 of the fetcher's manifest.

import "time"

// CopyMeta is the metadata file beside each copy.
type CopyMeta struct {
	Digest     string    `json:"digest"`
	Bytes      int64     `json:"bytes"`
	Priority   int32     `json:"priority"`
	LastUsed   time.Time `json:"lastUsed"`
	VerifiedAt time.Time `json:"verifiedAt"`
	SHA256     string    `json:"sha256,omitempty"`
}

// CopyMetaName is the name of the metadata file of the copy name, in the
// same directory: a dot file, so it never collides with a copy.
func CopyMetaName(name string) string { return "." + name + ".meta.json" }
