//go:build linux

package fetch

import (
	"context"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/fetch/fetchtest"
)

// The cache lock is Linux's (flock); elsewhere runs are not serialised.
func TestSecondFetcherWaitsForTheFirst(t *testing.T) {
	fx := newRepoFixture("acme/lock").add("w.safetensors", safetensorsBytes(fetchtest.Random(3<<20, 81)), true)
	hub := startHub(t, fx)
	hub.Faults.Throttle(5 * time.Millisecond)
	cfg := testConfig(t, "hf://acme/lock", hub.URL())
	defer func(d time.Duration) { lockPoll = d }(lockPoll)
	lockPoll = 10 * time.Millisecond

	errs := make(chan error, 2)
	results := make(chan *Result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			res, err := Run(context.Background(), cfg, Options{Logger: testLogger(t)})
			errs <- err
			results <- res
		}()
	}
	var downloaded int64
	for i := 0; i < 2; i++ {
		if err := <-errs; err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		downloaded += (<-results).Downloaded
	}
	assertTree(t, cfg.Dest, fx.files)
	// One run downloaded, the other found a complete cache.
	if total := totalSize(fx.files); downloaded != total || hub.Stats.BytesServed() != total {
		t.Errorf("two concurrent runs downloaded %d (served %d) bytes for %d", downloaded, hub.Stats.BytesServed(), total)
	}
}
