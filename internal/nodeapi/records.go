package nodeapi

// What the lifecycle leader tells the node agent about an artifact's
// engines: POST /wakes and POST /sleeps, from which the agent predicts
// the next wake.

import (
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// WakeRecord is the body of POST /wakes: one wake of an artifact, as the
// lifecycle leader reports it once the engines are awake. The node agent
// keeps the last wakes of each artifact (WakeHistory) to predict the next
// one.
type WakeRecord struct {
	Key
	// Time the wake began.
	Time time.Time `json:"time"`
	// Tier it restored from (hot, warm or cold) and the bytes and rate of
	// the restore; a cold rate becomes the cold tier's measured bandwidth.
	Tier           v1alpha1.Tier `json:"tier,omitempty"`
	Bytes          int64         `json:"bytes,omitempty"`
	BytesPerSecond float64       `json:"bytesPerSecond,omitempty"`
	Digest         string        `json:"digest,omitempty"`
	Priority       int32         `json:"priority,omitempty"`
	// ColdPath is the artifact inside the cold tier, when the agent mounts
	// it (--cold-dir).
	ColdPath string `json:"coldPath,omitempty"`
	// ColdS3 names the agent's S3 cold source (--cold-s3) holding the
	// artifact, when its cold tier is S3.
	ColdS3 string `json:"coldS3,omitempty"`
	// NoWarm says the application has no warm tier (tiers.warm: None; its
	// engines could not read a warm copy): the agent promotes its weights
	// from the cold tier straight to the hot tier, never into the warm tier.
	NoWarm bool `json:"noWarm,omitempty"`
}

// SleepRecord is the body of POST /sleeps: the engines of an artifact went
// to sleep, as the lifecycle leader reports it once they are asleep. With
// the wakes, it tells the agent whether the engines are asleep (a
// promotion only helps then) and how long after a sleep the next wake
// comes (the after-sleep pattern).
type SleepRecord struct {
	Key
	// Time the sleep was decided.
	Time time.Time `json:"time"`
	// Level of the sleep (1 or 2; 0: not told).
	Level int `json:"level,omitempty"`
}
