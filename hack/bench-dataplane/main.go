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
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/gctune"
)

func main() {
	gctune.Apply()
	levels := flag.String("concurrency", "1,16,64,256", "comma-separated concurrency levels")
	duration := flag.Duration("duration", 5*time.Second, "measurement time per level and target")
	warmup := flag.Duration("warmup", time.Second, "warm-up time per level and target")
	stream := flag.Bool("stream", false, "benchmark streamed requests")
	docs := flag.String("docs", "", "Markdown file whose bench-dataplane section receives the table")
	prof := flag.String("profile", "", "profile the measurement through the queue at the highest concurrency, writing "+
		"<prefix>.cpu.pprof, <prefix>.block.pprof, <prefix>.mutex.pprof, <prefix>.allocs.pprof (with <prefix>.allocs-before.pprof as its base) and <prefix>.goroutines.txt (taken as the measurement starts)")
	flag.Parse()

	cfg := dataplanetest.BenchConfig{Warmup: *warmup, Duration: *duration, Stream: *stream}
	for _, f := range strings.Split(*levels, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 {
			fmt.Fprintf(os.Stderr, "invalid concurrency %q\n", f)
			os.Exit(2)
		}
		cfg.Concurrency = append(cfg.Concurrency, c)
	}
	if *prof != "" {
		top := slices.Max(cfg.Concurrency)
		cfg.QueueProbe = func(c int) func() {
			if c != top {
				return func() {}
			}
			return startProfiles(*prof)
		}
	}
	loadBefore := loadAverage()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	rows, err := dataplanetest.RunBenchmark(ctx, cfg)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchmark failed: %v\n", err)
		os.Exit(1)
	}
	table := dataplanetest.FormatBenchmark(rows, *stream)
	gogc := os.Getenv("GOGC")
	if gogc == "" {
		gogc = strconv.Itoa(gctune.Percent)
	}
	section := fmt.Sprintf("Measured on %s/%s, %d CPUs, load average before the run %s, %s per level after %s warm-up; everything (load generator, gateway, NATS with file-backed JetStream, dispatcher, simulator) in one process, GOGC=%s as the data-plane binaries set it. \"Added\" is via queue minus direct.\n\n%s",
		runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), loadBefore, *duration, *warmup, gogc, table)
	fmt.Print(section)
	if *docs != "" {
		if err := dataplanetest.WriteSection(*docs, section); err != nil {
			fmt.Fprintf(os.Stderr, "writing %s: %v\n", *docs, err)
			os.Exit(1)
		}
	}
}

// startProfiles dumps the goroutines and starts CPU, blocking and mutex
// profiling; the returned function stops them and writes the profiles.
func startProfiles(prefix string) func() {
	writeProfile("goroutine", prefix+".goroutines.txt", 1)
	writeProfile("allocs", prefix+".allocs-before.pprof", 0)
	cpu, err := os.Create(prefix + ".cpu.pprof")
	if err == nil {
		err = pprof.StartCPUProfile(cpu)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cpu profile: %v\n", err)
	}
	runtime.SetBlockProfileRate(10_000) // about one sample per 10µs blocked
	runtime.SetMutexProfileFraction(10)
	return func() {
		pprof.StopCPUProfile()
		if cpu != nil {
			_ = cpu.Close() // the profile is best effort
		}
		writeProfile("block", prefix+".block.pprof", 0)
		writeProfile("mutex", prefix+".mutex.pprof", 0)
		writeProfile("allocs", prefix+".allocs.pprof", 0) // compare with -base allocs-before
		runtime.SetBlockProfileRate(0)
		runtime.SetMutexProfileFraction(0)
	}
}

// writeProfile writes the named runtime profile to path.
func writeProfile(name, path string, debug int) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s profile: %v\n", name, err)
		return
	}
	if err := pprof.Lookup(name).WriteTo(f, debug); err != nil {
		fmt.Fprintf(os.Stderr, "%s profile: %v\n", name, err)
	}
	if err := f.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "%s profile: %v\n", name, err)
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
