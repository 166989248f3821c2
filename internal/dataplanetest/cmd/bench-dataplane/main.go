// Command bench-dataplane measures the latency that the gateway, JetStream
// and the dispatcher add over calling the engine simulator directly, and the
// request rate they sustain. It prints a Markdown table and, with -docs,
// writes it between the bench-dataplane markers of that file.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
)

func main() {
	levels := flag.String("concurrency", "1,16,64,256", "comma-separated concurrency levels")
	duration := flag.Duration("duration", 5*time.Second, "measurement time per level and target")
	warmup := flag.Duration("warmup", time.Second, "warm-up time per level and target")
	stream := flag.Bool("stream", false, "benchmark streamed requests")
	docs := flag.String("docs", "", "Markdown file whose bench-dataplane section receives the table")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "cpu profile: %v\n", err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}

	cfg := dataplanetest.BenchConfig{Warmup: *warmup, Duration: *duration, Stream: *stream}
	for _, f := range strings.Split(*levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			fmt.Fprintf(os.Stderr, "invalid concurrency %q\n", f)
			os.Exit(2)
		}
		cfg.Concurrency = append(cfg.Concurrency, c)
	}
	loadBefore := loadAverage()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	rows, err := dataplanetest.RunBenchmark(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchmark failed: %v\n", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
	table := dataplanetest.FormatBenchmark(rows, *stream)
	section := fmt.Sprintf("Measured %s on %s/%s, %d CPUs, load average before the run %s, %s per level after %s warm-up; everything (load generator, gateway, NATS with file-backed JetStream, dispatcher, simulator) in one process. \"Added\" is via queue minus direct.\n\n%s",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadBefore, *duration, *warmup, table)
	fmt.Print(section)
	if *docs != "" {
		if err := dataplanetest.WriteSection(*docs, section); err != nil {
			fmt.Fprintf(os.Stderr, "writing %s: %v\n", *docs, err)
			pprof.StopCPUProfile()
			os.Exit(1)
		}
	}
}

// loadAverage returns the 1-minute load average, which says how much of the
// machine the benchmark had.
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
