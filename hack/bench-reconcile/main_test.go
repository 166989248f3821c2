package main

import (
	"strings"
	"testing"
	"time"
)

func row(n int, s subject, deploy, noopCPU time.Duration, peak float64) result {
	return result{n: n, subject: s, deploy: deploy, noopCPU: noopCPU, mem: memory{peak: peak},
		installCPU: time.Millisecond, benchCPU: 10 * time.Millisecond, requests: 7}
}

func TestFormatPeerTablePairsRowsAndCountsTargets(t *testing.T) {
	ours := subject{name: "ours", kind: orchestra}
	base := subject{name: "baseline abc", kind: orchestra}
	shipped := subject{name: "peer", kind: peer}
	tuned := subject{name: "peer, QPS 100 burst 200", kind: peer, args: peerTunedArgs}
	results := []result{
		row(50, base, time.Second, time.Millisecond, 80),
		row(50, ours, time.Second, 500*time.Microsecond, 80),
		row(50, shipped, 10*time.Second, 100*time.Millisecond, 100),
		row(50, tuned, 4*time.Second, 100*time.Millisecond, 100), // 4×: throughput target missed
		row(200, ours, 4*time.Second, 500*time.Microsecond, 90),
		row(200, shipped, 40*time.Second, 100*time.Millisecond, 100),
		row(200, tuned, 25*time.Second, 40*time.Millisecond, 85), // 6.25×, 80×, lower peak: only throughput met
	}
	got := formatPeerTable(results)
	for _, want := range []string{
		"| 50 | peer | 10.00 | 200 | 1.25 |",
		"| 50 | peer, QPS 100 burst 200 | 4.00 | 200 | 1.25 |",
		"| 200 | peer | 10.00 | 200 | 1.11 |",
		"| 200 | peer, QPS 100 burst 200 | 6.25 | 80 | 0.94 |",
		"install throughput ≥ 5×: met in 1 of 2 rows; CPU per no-op reconcile ≥ 100× less: 1 of 2; lower peak RSS: 1 of 2.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("peer table lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "baseline") {
		t.Errorf("the baseline row is compared with the peer:\n%s", got)
	}
}

func TestReplaceSection(t *testing.T) {
	doc := "# Benchmarks\n\n<!-- a:start -->\nold\n<!-- a:end -->\n\nprose\n"
	got := replaceSection(doc, "<!-- a:start -->", "<!-- a:end -->", "new\n", "A")
	if want := "# Benchmarks\n\n<!-- a:start -->\nnew\n<!-- a:end -->\n\nprose\n"; got != want {
		t.Errorf("replacing:\n got %q\nwant %q", got, want)
	}
	got = replaceSection(got, "<!-- b:start -->", "<!-- b:end -->", "added\n", "B")
	if want := "\nprose\n\n## B\n\n<!-- b:start -->\nadded\n<!-- b:end -->\n"; !strings.HasSuffix(got, want) {
		t.Errorf("adding: got %q, want it to end with %q", got, want)
	}
}

func TestFreeAddrsAreDistinct(t *testing.T) {
	addrs, err := freeAddrs(8)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("address %s returned twice: %v", a, addrs)
		}
		seen[a] = true
	}
}
