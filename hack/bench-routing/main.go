// Command bench-routing compares the dispatcher's routing policies
// (least-loaded, random, consistent hashing with bounded loads, prefix) on
// 4 simulator replicas with a prefix cache and a prefill rate: a multi-turn
// chat workload with shared system prompts and a workload without shared
// prefixes, interleaved in one run, everything in one process (gateway,
// NATS with JetStream, dispatchers, simulators). It prints a Markdown table
// and, with -docs, writes it between the bench-routing markers of that file.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/gctune"
)

func main() {
	gctune.Apply()
	var o options
	flag.DurationVar(&o.duration, "duration", 20*time.Second, "arrivals per run (the run then waits for its conversations to end)")
	flag.DurationVar(&o.warmup, "warmup", 4*time.Second, "requests sent before this are not measured")
	flag.IntVar(&o.rounds, "rounds", 2, "rounds; each runs every workload and routing once, in rotated order")
	flag.Float64Var(&o.prefillRate, "prefill-rate", 5000, "simulator prefill rate, tokens/s per replica")
	flag.Float64Var(&o.convRate, "conversations", 3.5, "multi-turn: new conversations per second (Poisson)")
	flag.Float64Var(&o.singleRate, "requests", 10, "no-sharing: requests per second (Poisson)")
	flag.Uint64Var(&o.seed, "seed", 1, "workload seed")
	flag.Float64Var(&o.loadCost, "load-cost", 0, "prefix routing's loadCost, blocks per request in flight (0: the dispatcher's learnt default)")
	docs := flag.String("docs", "", "Markdown file whose bench-routing section receives the table")
	only := flag.String("only", "", "semicolon-separated routing names to run (default all)")
	logPath := flag.String("log", "", "file that receives one JSON line per measured request (where it went, why, cached tokens)")
	flag.Parse()
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			os.Exit(1)
		}
		defer func() { _ = f.Close() }()
		o.log = f
	}
	if *only != "" {
		o.only = map[string]bool{}
		for _, n := range strings.Split(*only, ";") {
			o.only[strings.TrimSpace(n)] = true
		}
	}

	loadBefore := loadAverage()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	results, err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchmark failed: %v\n", err)
		os.Exit(1)
	}
	lo, hi := loadRange(runLoads)
	section := fmt.Sprintf("Measured on %s/%s, %d CPUs, load average %s before and %s after the run (%s to %s at the start of a run); %d rounds, every routing once per round in rotated order, %s of arrivals per run after %s not measured; everything (load generator, gateway, NATS with file-backed JetStream, dispatchers, 4 simulators) in one process.\n\n%s\n%s",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadBefore, loadAverage(), lo, hi, o.rounds, o.duration, o.warmup, describe(o), format(results))
	fmt.Print(section)
	if *docs != "" {
		if err := writeSection(*docs, section); err != nil {
			fmt.Fprintf(os.Stderr, "writing %s: %v\n", *docs, err)
			os.Exit(1)
		}
	}
}

// Markers delimit the benchmark's section of docs/benchmarks.md.
const (
	markerStart = "<!-- bench-routing:start -->"
	markerEnd   = "<!-- bench-routing:end -->"
)

// writeSection replaces the text between the markers in path (adding them
// at the end when absent) and leaves the rest of the file alone.
func writeSection(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	text := string(old)
	block := markerStart + "\n" + section + markerEnd
	i, j := strings.Index(text, markerStart), strings.Index(text, markerEnd)
	switch {
	case i >= 0 && j > i:
		text = text[:i] + block + text[j+len(markerEnd):]
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s has only one of the markers", path)
	default:
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		text += "\n## Routing\n\n" + block + "\n"
	}
	return os.WriteFile(path, []byte(text), 0o644)
}

// loadAverage returns the 1-minute load average.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "unknown"
	}
	return f[0]
}

// loadRange is the least and the greatest of load averages.
func loadRange(loads []string) (string, string) {
	lo, hi := "", ""
	var l, h float64
	for _, s := range loads {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			continue
		}
		if lo == "" || v < l {
			lo, l = s, v
		}
		if hi == "" || v > h {
			hi, h = s, v
		}
	}
	return lo, hi
}
