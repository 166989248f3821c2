package nodeapi

// The node agent's copies on disk, as the sidecar reads them: a copy of
// an artifact is the file <tier dir>/<namespace>/<name> (a GGUF, the
// simulator's weights) or the directory of that name holding a model's
// files (vLLM's safetensors model: config, tokenizer, shards), and beside
// it the metadata file CopyMetaName(name), written once the copy is
// complete and verified. A sidecar points its engine only at a copy whose
// metadata records the sizes and sha256 of the fetcher's manifest.

import "time"

// CopyMeta is the metadata file beside each copy.
type CopyMeta struct {
	Digest     string    `json:"digest"`
	Bytes      int64     `json:"bytes"`
	Priority   int32     `json:"priority"`
	LastUsed   time.Time `json:"lastUsed"`
	VerifiedAt time.Time `json:"verifiedAt"`
	SHA256     string    `json:"sha256,omitempty"`
	// Files, for a directory copy, are its files in the order their bytes
	// were hashed into Digest (the digest of their concatenation), each
	// with the manifest sha256 it was verified against. Empty for a copy
	// of one file.
	Files []CopyFile `json:"files,omitempty"`
}

// CopyFile is one file of a directory copy.
type CopyFile struct {
	// Path is slash-separated, inside the copy's directory.
	Path   string `json:"path"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// CopyFilesBytes is the files' total size.
func CopyFilesBytes(files []CopyFile) int64 {
	var n int64
	for _, f := range files {
		n += f.Bytes
	}
	return n
}

// CopyMetaName is the name of the metadata file of the copy name, in the
// same directory: a dot file, so it never collides with a copy.
func CopyMetaName(name string) string { return "." + name + ".meta.json" }
