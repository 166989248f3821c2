package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

// TestZeroCopyTable checks the zero-copy benchmark's table on made-up
// wakes: medians per case, the tier the status named, and the like-for-
// like line against the physical parts. It needs no cluster.
func TestZeroCopyTable(t *testing.T) {
	const n = 1 << 30
	bw := func(gbps float64) nodeapi.Bandwidth {
		return nodeapi.Bandwidth{BytesPerSecond: gbps * 1e9, Method: "m"}
	}
	var wakes []zeroWake
	for i, d := range []time.Duration{9 * time.Second, 10 * time.Second, 11 * time.Second} {
		wakes = append(wakes,
			zeroWake{kind: zeroCopyWith, ttft: d, loaded: time.Second, ready: d - time.Second, fromTier: v1alpha1.TierHot, bytes: n, probe: bw(10)},
			zeroWake{kind: zeroCopyWithout, ttft: d + 2*time.Second, loaded: time.Second, ready: d, fromTier: v1alpha1.TierCold, bytes: n, probe: bw(1)})
		if i == 2 {
			wakes[len(wakes)-1].fromTier = v1alpha1.TierHot
		}
	}
	out := zeroCopyTable(wakes, n, "1 1 1", "2 2 2", time.Minute)
	for _, want := range []string{
		"| hot copy on the node | 3 | Hot ×3 | 10.00 (m) | 107ms | 10s (9s–11s) | 9s | 1s |",
		"| no copy (dropped) | 3 | Cold ×2, Hot ×1 | 1.00 (m) | 1.074s | 12s (11s–13s) | 10s | 1s |",
		"with a hot copy 0.83 × the wake without a copy, 2s sooner, where the physical parts differ by 966ms",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, zeroCopyWarm) {
		t.Errorf("a case without wakes has a row:\n%s", out)
	}
}
