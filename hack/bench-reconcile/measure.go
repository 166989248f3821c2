package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/localcluster"
)

// metrics are the counters read from an operator's /metrics.
type metrics struct {
	// Ours (orchestra_*): no-op and install reconciles, renders, and API
	// requests by verb and resource (with --count-api-requests).
	noops, noopSum, renders, installs, installSum float64
	api                                           map[string]float64 // "verb resource" -> requests
	reconciles                                    map[string]float64 // outcome -> reconciles
	// Both operators (controller-runtime and client-go metrics): reconciles
	// by result, their total time, and API requests by method and code.
	crReconciles     map[string]float64 // result -> reconciles
	crReconcileSum   float64            // seconds
	crReconcileCount float64
	requests         map[string]float64 // "METHOD code" -> requests
	requestsTotal    float64
}

func scrape(addr string) (metrics, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return metrics{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	m := metrics{api: map[string]float64{}, reconciles: map[string]float64{}, crReconciles: map[string]float64{}, requests: map[string]float64{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		val := func() float64 {
			f, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			return f
		}
		switch {
		case strings.HasPrefix(line, "orchestra_helm_reconcile_duration_seconds_count{") && strings.Contains(line, `outcome="noop"`):
			m.noops += val()
		case strings.HasPrefix(line, "orchestra_helm_reconcile_duration_seconds_sum{") && strings.Contains(line, `outcome="noop"`):
			m.noopSum += val()
		case strings.HasPrefix(line, "orchestra_helm_reconcile_duration_seconds_count{") && strings.Contains(line, `outcome="install"`):
			m.installs += val()
		case strings.HasPrefix(line, "orchestra_helm_reconcile_duration_seconds_sum{") && strings.Contains(line, `outcome="install"`):
			m.installSum += val()
		case strings.HasPrefix(line, "orchestra_helm_renders_total{"):
			m.renders += val()
		case strings.HasPrefix(line, "orchestra_api_requests_total{"):
			m.api[label(line, "verb")+" "+label(line, "resource")] += val()
		case strings.HasPrefix(line, "controller_runtime_reconcile_total{"):
			m.crReconciles[label(line, "result")] += val()
		case strings.HasPrefix(line, "controller_runtime_reconcile_time_seconds_sum{"):
			m.crReconcileSum += val()
		case strings.HasPrefix(line, "controller_runtime_reconcile_time_seconds_count{"):
			m.crReconcileCount += val()
		case strings.HasPrefix(line, "rest_client_requests_total{"):
			m.requests[label(line, "method")+" "+label(line, "code")] += val()
			m.requestsTotal += val()
		}
		if strings.HasPrefix(line, "orchestra_helm_reconcile_duration_seconds_count{") {
			m.reconciles[label(line, "outcome")] += val()
		}
	}
	return m, sc.Err()
}

func (m metrics) crReconcilesTotal() float64 {
	total := 0.0
	for _, v := range m.crReconciles {
		total += v
	}
	return total
}

func label(line, name string) string {
	_, rest, ok := strings.Cut(line, name+`="`)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(rest, `"`)
	return v
}

// perInstall formats the counters that grew from a to b, divided by n.
func perInstall(a, b map[string]float64, n int) string {
	keys := make([]string, 0, len(b))
	total := 0.0
	for k, v := range b {
		if d := v - a[k]; d > 0 {
			keys = append(keys, k)
			total += d
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		di, dj := b[keys[i]]-a[keys[i]], b[keys[j]]-a[keys[j]]
		if di != dj {
			return di > dj
		}
		return keys[i] < keys[j]
	})
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, (b[k]-a[k])/float64(n)))
	}
	return fmt.Sprintf("%.2f: %s", total/float64(n), strings.Join(parts, ", "))
}

// apiServerRequests reads kube-apiserver's apiserver_request_total: the
// requests it served from every client (the operator, kube-controller-manager,
// this benchmark), by "VERB resource[/subresource] code".
func apiServerRequests(hc *http.Client, host string) (map[string]float64, error) {
	resp, err := hc.Get(strings.TrimSuffix(host, "/") + "/metrics")
	if err != nil {
		return nil, fmt.Errorf("reading kube-apiserver's metrics: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("reading kube-apiserver's metrics: %s", resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		resource := label(line, "resource")
		if sub := label(line, "subresource"); sub != "" {
			resource += "/" + sub
		}
		if resource == "" {
			resource = "(non-resource)"
		}
		v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		out[label(line, "verb")+" "+resource+" "+label(line, "code")] += v
	}
	return out, sc.Err()
}

// growth is how much the counters grew from a to b in all.
func growth(a, b map[string]float64) float64 {
	total := 0.0
	for k, v := range b {
		total += max(v-a[k], 0)
	}
	return total
}

// eventsPerInstall counts the events in ns by the component that reported
// them, per custom resource.
func eventsPerInstall(ctx context.Context, c client.Client, ns string, n int) (string, error) {
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(ns)); err != nil {
		return "", fmt.Errorf("listing events: %w", err)
	}
	by := map[string]float64{}
	for _, e := range events.Items {
		by[cmp.Or(e.ReportingController, e.Source.Component, "unknown")+" "+e.Reason] += float64(max(e.Count, 1))
	}
	return perInstall(nil, by, n), nil
}

// releaseRecords counts Helm's release records (Secrets of type
// helm.sh/release.v1, one per release revision) in ns.
func releaseRecords(ctx context.Context, c client.Client, ns string) (int, error) {
	var secrets corev1.SecretList
	if err := c.List(ctx, &secrets, client.InNamespace(ns), client.MatchingFields{"type": "helm.sh/release.v1"}); err != nil {
		return 0, fmt.Errorf("listing release records: %w", err)
	}
	return len(secrets.Items), nil
}

// clkTck is USER_HZ on Linux, the unit of /proc's CPU times.
const clkTck = 100

// processCPU is the user+system CPU time of pid.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clkTck, nil
}

// machineCPU is the CPU time so far of the operator, of each component of
// the local cluster, of this process, and of the whole machine (busy time
// from /proc/stat), by name.
func machineCPU(cluster *localcluster.Cluster, operator int) map[string]time.Duration {
	out := map[string]time.Duration{}
	pids := cluster.Processes()
	pids["operator"] = operator
	pids["benchmark client"] = os.Getpid()
	for name, pid := range pids {
		if d, err := processCPU(pid); err == nil {
			out[name] = d
		}
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		var busy int64
		for i, v := range f[1:] {
			if i == 3 || i == 4 { // idle, iowait
				continue
			}
			x, _ := strconv.ParseInt(v, 10, 64)
			busy += x
		}
		out["machine"] = time.Duration(busy) * time.Second / clkTck
	}
	return out
}

// perInstallCPU formats the CPU each process used between a and b, per
// custom resource, largest first, and what the rest of the machine used.
func perInstallCPU(a, b map[string]time.Duration, n int) string {
	var names []string
	var procs time.Duration
	for k, v := range b {
		if k != "machine" {
			names = append(names, k)
			procs += v - a[k]
		}
	}
	sort.Slice(names, func(i, j int) bool { return b[names[i]]-a[names[i]] > b[names[j]]-a[names[j]] })
	total := b["machine"] - a["machine"]
	parts := make([]string, 0, len(names)+1)
	for _, k := range names {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", k, ms(b[k]-a[k], n)))
	}
	parts = append(parts, fmt.Sprintf("rest of machine %.1f ms", ms(total-procs, n)))
	return fmt.Sprintf("%.1f ms: %s", ms(total, n), strings.Join(parts, ", "))
}

// sha256Rate is how many MiB/s one core hashes with sha256: a measure of
// the machine's speed at the moment.
func sha256Rate() float64 {
	buf := make([]byte, 1<<20)
	h := sha256.New()
	start := time.Now()
	for range 256 {
		h.Write(buf)
	}
	return 256 / time.Since(start).Seconds()
}

func ms(d time.Duration, n int) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }

// memory is a process's resident memory, MiB.
type memory struct {
	rss, peak float64
	// anon is the private (anonymous) part of rss; the rest is the
	// executable's pages, shared and reclaimable.
	anon float64
}

func processMemory(pid int) (memory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memory{}, err
	}
	var m memory
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			m.rss = kb / 1024
		case "VmHWM:":
			m.peak = kb / 1024
		case "RssAnon:":
			m.anon = kb / 1024
		}
	}
	return m, nil
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func fetchProfile(addr, path string, seconds int) {
	fetchURL(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds), path)
}

// fetchAPIServerProfile writes a CPU profile of kube-apiserver, taken with
// the cluster's admin credentials.
func fetchAPIServerProfile(cluster *localcluster.Cluster, path string, seconds int) {
	cfg := cluster.Config()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "profiling kube-apiserver:", err)
		return
	}
	fetchURLWith(hc, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(cfg.Host, "/"), seconds), path)
}

func fetchURL(url, path string) { fetchURLWith(http.DefaultClient, url, path) }

func fetchURLWith(hc *http.Client, url, path string) {
	resp, err := hc.Get(url)
	if err != nil {
		return
	}
	defer func() { _ = resp.Body.Close() }()
	f, err := os.Create(path)
	if err != nil {
		return
	}
	_, _ = io.Copy(f, resp.Body)
	_ = f.Close()
}
