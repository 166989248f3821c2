package nodeapi

// The node report (GET /report) and the answers it is made of.

import (
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// NodeReport is what a node can do for checkpoints: the body of GET /report.
type NodeReport struct {
	Time time.Time  `json:"time"`
	Hot  TierReport `json:"hot"`
	Warm TierReport `json:"warm"`
	// Memcpy is the bound for any restore into memory.
	Memcpy *Bandwidth `json:"memcpy,omitempty"`
	// TransparentHugePages is the kernel's THP mode for anonymous memory
	// (restores read into MADV_HUGEPAGE arenas, which need madvise or always).
	TransparentHugePages string `json:"transparentHugePages,omitempty"`
	// TransparentHugePagesDefrag is the THP defrag mode: with "madvise" or
	// "always", the first touch of an MADV_HUGEPAGE arena may stall in
	// direct compaction when free memory is held by the page cache.
	TransparentHugePagesDefrag string `json:"transparentHugePagesDefrag,omitempty"`
	// FreePageReporting is true in a VM whose balloon hands freed memory
	// back to the host: a wake then faults host pages in again, and
	// memory faulted in for one wake uses 4 KiB pages, which fault in
	// faster there (device regions, faulted in once, stay in huge pages).
	FreePageReporting bool          `json:"freePageReporting,omitempty"`
	CRIU              CRIUReport    `json:"criu"`
	Runtime           RuntimeReport `json:"runtime"`
	// ProcessSnapshots is true when both CRIU and the runtime can
	// checkpoint a container; Reason says why not.
	ProcessSnapshots       bool   `json:"processSnapshots"`
	ProcessSnapshotsReason string `json:"processSnapshotsReason,omitempty"`
	// Verification is the periodic re-hashing of the kept copies.
	Verification VerificationReport `json:"verification"`
	// Promotion is the promotion ahead of predicted wakes.
	Promotion PromotionReport `json:"promotion"`
	// Cold are the cold sources the agent reads (the model cache mount,
	// S3 objects), each with its last copy and its measured rate.
	Cold []ColdReport `json:"cold,omitempty"`
}

// VerificationReport is the state of the periodic re-hashing of the copies
// the agent keeps (--verify-interval).
type VerificationReport struct {
	// IntervalSeconds between passes; 0: the agent does not re-verify.
	IntervalSeconds int64 `json:"intervalSeconds"`
	// LastTime is when the last pass ended; Copies how many it hashed.
	LastTime *time.Time `json:"lastTime,omitempty"`
	Copies   int        `json:"copies"`
	// Dropped are the copies removed because they no longer verified,
	// newest last (at most 32 since the agent started).
	Dropped []Verification `json:"dropped,omitempty"`
}

// TierReport describes one tier directory.
type TierReport struct {
	Dir string `json:"dir"`
	// Filesystem is "tmpfs" or the statfs magic number in hex.
	Filesystem  string `json:"filesystem"`
	SizeBytes   int64  `json:"sizeBytes"`
	FreeBytes   int64  `json:"freeBytes"`
	BudgetBytes int64  `json:"budgetBytes"`
	// UsedBytes counts the agent's copies and, in the hot tier, the
	// engines' level-1 offloads (EngineOffloadBytes of them).
	UsedBytes int64 `json:"usedBytes"`
	// EngineOffloadBytes is what the engines' level-1 offloads hold in the
	// hot tier: counted in UsedBytes and the budget, never evicted by the
	// agent.
	EngineOffloadBytes int64      `json:"engineOffloadBytes,omitempty"`
	Entries            int        `json:"entries"`
	Read               *Bandwidth `json:"read,omitempty"`
	// HugePages is the tmpfs huge= option ("within_size", "always", …;
	// "never" for 4 KiB pages), empty off a tmpfs.
	HugePages string `json:"hugePages,omitempty"`
	// Mount says whether the agent mounted the directory, or why not.
	Mount   string `json:"mount,omitempty"`
	Warning string `json:"warning,omitempty"`
}

// CRIUReport is the result of probing criu.
type CRIUReport struct {
	Present     bool   `json:"present"`
	Version     string `json:"version,omitempty"`
	CheckPassed bool   `json:"checkPassed"`
	// Output is the tail of `criu check`.
	Output string `json:"output,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// RuntimeReport is the container runtime's checkpoint support.
type RuntimeReport struct {
	Version string `json:"version,omitempty"`
	// Source is where Version came from: "--runtime-version" (the agent
	// chart's runtimeVersion), "node <name>" (its
	// status.nodeInfo.containerRuntimeVersion) or "containerd --version".
	Source              string `json:"source,omitempty"`
	CheckpointSupported bool   `json:"checkpointSupported"`
	Reason              string `json:"reason"`
}

// Kinds of cold tier the node agent reads.
const (
	// ColdModelCache is a file of an application's model cache, mounted
	// read-only under the agent's --cold-dir.
	ColdModelCache = "modelCache"
	// ColdS3 is an object of an S3-compatible store (--cold-s3), read with
	// the fetcher's S3 client.
	ColdS3 = "s3"
)

// ColdReport is one cold source in the node report: the model cache mount
// or an S3 object, and the rate of the last copy the agent read from it.
type ColdReport struct {
	// Source is ColdModelCache for --cold-dir, else the S3 source's name.
	Source string `json:"source"`
	Kind   string `json:"kind"`
	// Location is the directory or s3://bucket/key (endpoint).
	Location string `json:"location"`
	// Read is the last copy from it (bytes, seconds, bytes/s), LastTime
	// when it began; LastError is set when it failed (nothing placed).
	Read      *Bandwidth `json:"read,omitempty"`
	LastTime  *time.Time `json:"lastTime,omitempty"`
	LastError string     `json:"lastError,omitempty"`
}

// Bandwidth is one measured transfer.
type Bandwidth struct {
	// What was measured: memcpy, or a read from a tier directory.
	What           string  `json:"what"`
	Bytes          int64   `json:"bytes"`
	Seconds        float64 `json:"seconds"`
	BytesPerSecond float64 `json:"bytesPerSecond"`
	// Method: "copy", "read" (page cache or tmpfs), "O_DIRECT", or
	// "read after fadvise(DONTNEED)".
	Method string `json:"method"`
}

// PromotionReport is the promotion ahead of predicted wakes in the node
// report.
type PromotionReport struct {
	// IntervalSeconds between plans; 0: the agent does not promote ahead.
	IntervalSeconds int64 `json:"intervalSeconds"`
	MarginSeconds   int64 `json:"marginSeconds"`
	// Predictions are the next wakes the agent expects, earliest first.
	Predictions []PredictedWake `json:"predictions,omitempty"`
	// LastTime is when the last plan ran.
	LastTime *time.Time `json:"lastTime,omitempty"`
	// Done are the promotions made ahead of a wake, newest last (at most
	// 32 since the agent started); Deferred those the last plan wanted
	// and could not make, with the reason.
	Done     []PromotionDone `json:"done,omitempty"`
	Deferred []Deferred      `json:"deferred,omitempty"`
}

// PredictedWake is one artifact's next expected wake.
type PredictedWake struct {
	Key
	Prediction
	// Wakes is how many wakes the prediction is made from.
	Wakes int `json:"wakes"`
}

// PromotionDone is one promotion made ahead of a predicted wake.
type PromotionDone struct {
	Promotion
	Time    time.Time `json:"time"`
	Seconds float64   `json:"seconds"`
	// Error is set when the copy failed (nothing was placed).
	Error string `json:"error,omitempty"`
}

// Patterns a wake prediction is based on.
const (
	// PatternPeriodic: the last intervals between wakes agree; the next
	// wake is the last one plus their median.
	PatternPeriodic = "periodic"
	// PatternDaily: wakes on at least two different days came at the same
	// time of day; the next wake is that time's next occurrence.
	PatternDaily = "daily"
	// PatternAfterSleep: the last times from falling asleep to the next
	// wake agree; the next wake is when the engines last fell asleep plus
	// their median. It sees
	// an application that is asked for again a steady time after it
	// falls idle, however long it was busy.
	PatternAfterSleep = "after-sleep"
)

// Prediction is the next expected wake of an artifact.
type Prediction struct {
	Next    time.Time `json:"next"`
	Pattern string    `json:"pattern"`
	// Period is the periodic pattern's interval (0 for daily).
	Period time.Duration `json:"period,omitempty"`
}

// Promotion is one planned copy up a tier ahead of a predicted wake.
type Promotion struct {
	Key
	From  v1alpha1.Tier `json:"from"`
	To    v1alpha1.Tier `json:"to"`
	Bytes int64         `json:"bytes"`
	// Wake is the predicted wake it is for; Lead how long before it the
	// copies up to the hot tier take (with the margin).
	Wake Prediction    `json:"wake"`
	Lead time.Duration `json:"lead"`
	// Evictions are what admitting the copy takes (nodeagent.PlanAdmit).
	Evictions []Action `json:"evictions,omitempty"`
}

// Deferred is a due promotion that cannot happen now, and why.
type Deferred struct {
	Key
	To     v1alpha1.Tier `json:"to"`
	Reason string        `json:"reason"`
}
