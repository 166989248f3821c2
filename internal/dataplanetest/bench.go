package dataplanetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// BenchConfig shapes the data-plane benchmark.
type BenchConfig struct {
	// Concurrency levels to measure latency at.
	Concurrency []int
	// Warmup and Duration per measurement.
	Warmup, Duration time.Duration
	// Stream measures streamed requests instead of plain ones.
	Stream bool
	// QueueProbe, when set, is called as each measurement through the queue
	// starts (after the warm-up, under load); the function it returns is
	// called as the measurement ends. Profilers hook in here.
	QueueProbe func(concurrency int) (end func())
}

// BenchRow is one concurrency level, direct to the engine and through the
// gateway, queue and dispatcher.
type BenchRow struct {
	Concurrency   int
	Direct, Queue Sample
}

// Sample summarises one measurement.
type Sample struct {
	P50, P99 time.Duration
	PerSec   float64
	Requests int
	Errors   int
	// CPUPerRequest is the process's CPU time (user + system, everything
	// in the process) over the measurement divided by the requests: unlike
	// the rate, it hardly depends on what else the machine runs.
	CPUPerRequest time.Duration
}

// RunBenchmark starts a data plane around a zero-latency simulator and
// measures, at each concurrency, the latency of requests sent straight to
// the simulator and through gateway -> JetStream -> dispatcher.
func RunBenchmark(ctx context.Context, cfg BenchConfig) ([]BenchRow, error) {
	simCfg := FastSim()
	simCfg.MaxNumSeqs = 4096
	s, err := StartStack(StackConfig{Sim: simCfg})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	if _, err := s.StartDispatcher(); err != nil {
		return nil, err
	}
	body := []byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"benchmark the data plane"}],"max_tokens":16,"stream":%v}`, simCfg.Model, cfg.Stream))
	var rows []BenchRow
	for _, c := range cfg.Concurrency {
		direct, err := load(ctx, s.Engine.URL+"/v1/chat/completions", "", body, c, cfg.Warmup, cfg.Duration, nil)
		if err != nil {
			return nil, fmt.Errorf("direct at concurrency %d: %w", c, err)
		}
		var probe func() func()
		if cfg.QueueProbe != nil {
			probe = func() func() { return cfg.QueueProbe(c) }
		}
		viaQueue, err := load(ctx, s.Gateway.URL+"/v1/chat/completions", APIKey, body, c, cfg.Warmup, cfg.Duration, probe)
		if err != nil {
			return nil, fmt.Errorf("through the queue at concurrency %d: %w", c, err)
		}
		rows = append(rows, BenchRow{Concurrency: c, Direct: direct, Queue: viaQueue})
	}
	return rows, nil
}

// load runs c closed-loop clients against url and measures after warmup.
func load(ctx context.Context, url, key string, body []byte, c int, warmup, d time.Duration, probe func() (end func())) (Sample, error) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: c, MaxIdleConnsPerHost: c}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		errs      atomic.Int64
		firstErr  atomic.Value
		measuring atomic.Bool
	)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				began := time.Now()
				res, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, res.Body)
					_ = res.Body.Close() // read to the end already; nothing to lose
					if err == nil && res.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %s", res.Status)
					}
				}
				took := time.Since(began)
				if !measuring.Load() {
					continue
				}
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				mine = append(mine, took)
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		})
	}
	time.Sleep(warmup)
	measuring.Store(true)
	end := func() {}
	if probe != nil {
		end = probe()
	}
	began, cpuBefore := time.Now(), processCPU()
	time.Sleep(d)
	measuring.Store(false)
	elapsed, cpu := time.Since(began), processCPU()-cpuBefore
	end()
	cancel()
	wg.Wait()
	if len(latencies) == 0 {
		if err, ok := firstErr.Load().(error); ok {
			return Sample{}, err
		}
		return Sample{}, errors.New("no request completed")
	}
	slices.Sort(latencies)
	return Sample{
		P50:      latencies[len(latencies)/2],
		P99:      latencies[len(latencies)*99/100],
		PerSec:   float64(len(latencies)) / elapsed.Seconds(),
		Requests: len(latencies),
		Errors:   int(errs.Load()),
		// The last requests may end just after the measurement: close enough.
		CPUPerRequest: cpu / time.Duration(len(latencies)),
	}, nil
}

// processCPU returns the user plus system CPU time of this process so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// FormatBenchmark renders rows as a Markdown table.
func FormatBenchmark(rows []BenchRow, stream bool) string {
	var b strings.Builder
	kind := "non-streamed"
	if stream {
		kind = "streamed"
	}
	fmt.Fprintf(&b, "Chat completions (%s, 16 tokens), simulator at zero latency.\n\n", kind)
	b.WriteString("| concurrency | direct p50 | direct p99 | via queue p50 | via queue p99 | added p50 | added p99 | direct req/s | via queue req/s | direct CPU/req | via queue CPU/req | errors |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %s | %s | %d |\n", r.Concurrency,
			ms(r.Direct.P50), ms(r.Direct.P99), ms(r.Queue.P50), ms(r.Queue.P99),
			ms(r.Queue.P50-r.Direct.P50), ms(r.Queue.P99-r.Direct.P99),
			r.Direct.PerSec, r.Queue.PerSec, us(r.Direct.CPUPerRequest), us(r.Queue.CPUPerRequest),
			r.Direct.Errors+r.Queue.Errors)
	}
	var best, bestDirect BenchRow
	for _, r := range rows {
		if r.Queue.PerSec > best.Queue.PerSec {
			best = r
		}
		if r.Direct.PerSec > bestDirect.Direct.PerSec {
			bestDirect = r
		}
	}
	fmt.Fprintf(&b, "\nMax requests/s through gateway + queue + dispatcher: %.0f (concurrency %d); direct to the simulator: %.0f (concurrency %d).\n",
		best.Queue.PerSec, best.Concurrency, bestDirect.Direct.PerSec, bestDirect.Concurrency)
	return b.String()
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

// Markers delimit the benchmark's section of docs/benchmarks.md.
const (
	MarkerStart = "<!-- bench-dataplane:start -->"
	MarkerEnd   = "<!-- bench-dataplane:end -->"
)

// WriteSection replaces the text between the markers in path (adding the
// markers at the end when absent) and leaves the rest of the file alone.
func WriteSection(path, section string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	text := string(old)
	block := MarkerStart + "\n" + section + MarkerEnd
	i, j := strings.Index(text, MarkerStart), strings.Index(text, MarkerEnd)
	switch {
	case i >= 0 && j > i:
		text = text[:i] + block + text[j+len(MarkerEnd):]
	case i >= 0 || j >= 0:
		return fmt.Errorf("%s has only one of the markers %s and %s", path, MarkerStart, MarkerEnd)
	default:
		if text == "" {
			text = "# Benchmarks\n"
		}
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		text += "\n## Data plane\n\n" + block + "\n"
	}
	return os.WriteFile(path, []byte(text), 0o644)
}
