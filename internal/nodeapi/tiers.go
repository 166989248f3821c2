package nodeapi

// The tiers and the copies in them: the vocabulary of every request and
// answer of the node agent.

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// The tiers are the API's (v1alpha1.Tier: TierHot is RAM, a tmpfs;
// TierWarm node-local disk; TierCold the application's model cache or S3,
// not owned by the agent), one vocabulary from the node agent's wire to
// the status. Decoding also accepts the lowercase spelling of earlier
// releases (v1alpha1.Tier.UnmarshalText).

// Key names one weights artifact: a namespace (one directory per namespace,
// mode 0700) and a file name within it.
type Key struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// String is namespace/name.
func (k Key) String() string { return k.Namespace + "/" + k.Name }

// Entry is one copy of an artifact in one tier.
type Entry struct {
	Key
	Tier     v1alpha1.Tier `json:"tier"`
	Bytes    int64         `json:"bytes"`
	Digest   string        `json:"digest"`
	Priority int32         `json:"priority"`
	LastUsed time.Time     `json:"lastUsed"`
	// VerifiedAt is when the copy last hashed to Digest.
	VerifiedAt time.Time `json:"verifiedAt"`
	// SHA256 is the fetcher's manifest sha256 the copy's bytes hashed to
	// when it was made from a model file of the cold tier (and carried by
	// every copy between tiers since): the model file it is, byte for
	// byte. Empty for copies of anything else (the simulator's weights).
	// The sidecar points an engine only at a copy whose SHA256 is the
	// manifest's sha256 of its model file (internal/sidecar's ModelCopies).
	SHA256 string `json:"sha256,omitempty"`
	// Files is the number of files of a directory copy (a vLLM model:
	// each file verified against the manifest's sha256, listed in the
	// copy's metadata, CopyMeta.Files); 0 for a copy of one file.
	Files int `json:"files,omitempty"`
	// Pinned copies are being read or written and are never evicted.
	Pinned bool `json:"pinned,omitempty"`
	// Offload marks an engine's level-1 offload (EngineOffloadName) in
	// the hot directory: the engine wrote it and releases it (its wake, or
	// a sleep at level 2), so it counts against the hot budget but the
	// agent never evicts it (it is also Pinned). Its Bytes are the bytes
	// the tmpfs holds for it, which a wake lowers block by block.
	Offload bool `json:"offload,omitempty"`
	// NoWarm marks a copy of an application without a warm tier
	// (tiers.warm None, nodeagent.Store.SetNoWarm): evicted from the hot tier, it
	// is dropped, never demoted.
	NoWarm bool `json:"noWarm,omitempty"`
}

// Budgets bound the bytes the agent keeps per tier.
type Budgets struct {
	Hot  int64 `json:"hot"`
	Warm int64 `json:"warm"`
}

// ActionKind is what a planned action does to a copy.
type ActionKind string

const (
	// ActionDemote moves a hot copy to the warm tier (demote before you drop).
	ActionDemote ActionKind = "demote"
	// ActionDrop deletes a copy from its tier; a lower tier still has the bytes.
	ActionDrop ActionKind = "drop"
)

// Action is one step of a plan, applied in order.
type Action struct {
	Kind  ActionKind    `json:"kind"`
	Key   Key           `json:"key"`
	From  v1alpha1.Tier `json:"from"`
	Bytes int64         `json:"bytes"`
}

// dnsLabel is a namespace a Key may name: one directory per namespace.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// Validate checks that k is safe to use as a path.
func (k Key) Validate() error {
	var errs []error
	if !dnsLabel.MatchString(k.Namespace) {
		errs = append(errs, fmt.Errorf("namespace %q is not a DNS label", k.Namespace))
	}
	if k.Name == "" || k.Name == "." || k.Name == ".." || strings.ContainsAny(k.Name, "/\x00") || strings.HasPrefix(k.Name, ".") {
		errs = append(errs, fmt.Errorf("name %q must be a plain file name not starting with a dot", k.Name))
	}
	return errors.Join(errs...)
}

// ValidNamespace reports whether ns can be a Key's namespace (a DNS
// label).
func ValidNamespace(ns string) bool { return dnsLabel.MatchString(ns) }

// EngineOffloadName is the file name under which an engine offloads the
// weights named name at sleep level 1, in its namespace's hot directory:
// a dot file ("."+name+".level1", internal/sim), so it never collides with
// a copy the store keeps under name. The store counts it against the hot
// budget and lists it (Entry.Offload) but never evicts it.
func EngineOffloadName(name string) string { return "." + name + ".level1" }

// DemoteSource says what a demotion copied into the warm tier.
type DemoteSource string

// Verification is the outcome of re-hashing one copy (nodeagent.Store.Verify).
type Verification struct {
	Key
	Tier v1alpha1.Tier `json:"tier"`
	// Digest is the digest recorded for the copy; Got what its bytes hash
	// to now (empty when they could not be read).
	Digest string `json:"digest"`
	Got    string `json:"got,omitempty"`
	// Dropped is true when the copy no longer verified and was removed:
	// the next wake reads the tier below.
	Dropped bool      `json:"dropped"`
	Error   string    `json:"error,omitempty"`
	Time    time.Time `json:"time"`
}

const (
	// DemoteFromStore: the store's own hot copy (released once the warm
	// copy verified).
	DemoteFromStore DemoteSource = "store"
	// DemoteFromEngine: the engine's level-1 offload in the hot directory
	// (released by the engine: its next wake or a sleep at level 2).
	DemoteFromEngine DemoteSource = "engine"
	// DemoteWarmHeld: the warm tier already held a copy with the digest.
	DemoteWarmHeld DemoteSource = "warm"
)

// PromoteRequest is the body of POST /promote.
type PromoteRequest struct {
	Key
	// To is hot or warm.
	To v1alpha1.Tier `json:"to"`
	// ColdPath is the artifact inside the cold tier (the model cache
	// mount), used when no faster tier holds it.
	ColdPath string `json:"coldPath,omitempty"`
	// ColdS3 names the agent's S3 cold source (--cold-s3) to read instead,
	// the application's; exclusive with ColdPath.
	ColdS3 string `json:"coldS3,omitempty"`
	// Digest, when set, must match the cold bytes (xxh3c:…); required
	// with ColdS3.
	Digest   string `json:"digest,omitempty"`
	Priority int32  `json:"priority,omitempty"`
	// Sidecar is the base URL (http://<pod IP>:<port>) of the sidecar of
	// an engine on the agent's node, which hands out the model's files
	// from its model cache (sidecarapi.PathModelFiles): the cold copy
	// where the agent does not mount the cache. Exclusive with ColdPath
	// and ColdS3; the agent verifies every byte against the manifest
	// sha256 the sidecar names (sidecar.go).
	Sidecar string `json:"sidecar,omitempty"`
}

// DemoteRequest is the body of POST /demote: move an artifact's weights
// from the hot tier to the warm tier (nodeagent.Store.Demote).
type DemoteRequest struct {
	Key
	// Digest is the digest the engine recorded when it loaded the weights
	// (xxh3c:…); the warm copy must hash to it. Required when the source is
	// the engine's level-1 offload rather than a copy the agent holds.
	Digest   string `json:"digest,omitempty"`
	Priority int32  `json:"priority,omitempty"`
}

// DemoteResult is the answer of POST /demote.
type DemoteResult struct {
	// Entry is the verified warm copy.
	Entry
	// Source is what was copied: store (the agent's hot copy, now
	// released), engine (the engine's level-1 offload, which the engine
	// releases) or warm (the warm tier held the digest already).
	Source DemoteSource `json:"source"`
}

// TiersStatus is the body of GET /tiers.
type TiersStatus struct {
	Budgets Budgets                 `json:"budgets"`
	Used    map[v1alpha1.Tier]int64 `json:"used"`
	Entries []Entry                 `json:"entries"`
}
