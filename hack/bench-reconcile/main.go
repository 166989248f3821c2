// Command bench-reconcile measures the Helm reconciler engine on the local
// control plane: the time from creating N custom resources to all of them
// Deployed (timed from when the operator's caches have synced; its start-up
// time is reported apart), the operator's CPU per no-op reconcile, and its
// memory.
//
// It builds cmd/orchestra-operator and runs it as a separate process (so
// that its CPU and RSS are its own) against etcd, kube-apiserver and
// kube-controller-manager from bin/, with a chart of one ConfigMap and one
// Deployment and 2 workers. It prints a table and, with -docs, rewrites the
// bench-reconcile section of docs/benchmarks.md.
//
//	go run ./hack/bench-reconcile -n 50,200 -docs docs/benchmarks.md
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/localcluster"
)

// profileDir, when set, receives CPU profiles of the operator and of
// kube-apiserver.
var profileDir string

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

var sampleGVK = schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}

type result struct {
	n           int
	label       string // the baseline's, or "" for the working tree
	deploy      time.Duration
	machine     time.Duration // the machine's CPU per custom resource, create → all Deployed
	first       time.Duration // create → the first resource Deployed
	noopCount   float64
	noopCPU     time.Duration // operator CPU per no-op reconcile
	rendersNoop float64       // renders during the no-op window (want 0)
	rssMiB      float64
	peakRSSMiB  float64
	noopMean    string
	installCPU  time.Duration // operator CPU per CR during the deploy phase
	installMean float64       // mean install reconcile time, seconds
	anonMiB     float64       // anonymous (private) RSS
	load        string        // /proc/loadavg when the run started
	ready       time.Duration // operator start → caches synced (/readyz)
	// Per custom resource, from create to all Deployed: API requests by
	// verb and resource, and reconciles by outcome.
	apiPerInstall, reconcilesPerInstall string
	// cpuPerInstall is the machine's CPU per custom resource from create
	// to all Deployed, by process.
	cpuPerInstall string
	// hashRate is sha256 MiB/s on one core just before the run: how fast
	// the machine was (a virtual machine's speed varies).
	hashRate float64
}

func main() {
	ns := flag.String("n", "50,200", "comma-separated numbers of custom resources")
	workers := flag.Int("workers", 2, "reconcile workers")
	window := flag.Duration("noop-window", 10*time.Second, "how long to measure no-op reconciles")
	warmup := flag.Int("warmup", 20, "resources deployed (and not measured) before the measured runs, to warm the control plane; 0: none")
	docs := flag.String("docs", "", "rewrite the bench-reconcile section of this markdown file")
	baseline := flag.String("baseline", "", "also measure the operator built from this git revision, each row right before the same row of the working tree's, and print the ratios")
	rounds := flag.Int("rounds", 1, "measure every row this many times")
	flag.StringVar(&profileDir, "profile-dir", "", "write CPU profiles of the operator here")
	flag.Parse()
	if err := run(*ns, *workers, *warmup, *rounds, *window, *docs, *baseline); err != nil {
		fmt.Fprintln(os.Stderr, "bench-reconcile:", err)
		os.Exit(1)
	}
}

func run(nList string, workers, warmup, rounds int, window time.Duration, docs, baseline string) error {
	root, err := localcluster.ModuleRoot()
	if err != nil {
		return err
	}
	ctx := context.Background()
	fmt.Fprintln(os.Stderr, "starting the local control plane ...")
	cluster, err := localcluster.Start(ctx, localcluster.Options{ControllerManager: true, Profiling: profileDir != ""})
	if err != nil {
		return err
	}
	defer func() {
		if err := cluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the local control plane:", err)
		}
	}()
	cfg := cluster.Config()
	cfg.QPS, cfg.Burst = 500, 1000
	scheme := k8sruntime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = apiextensionsv1.AddToScheme(scheme)
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	if err := installCRD(ctx, c, filepath.Join(root, "internal/helmreconciler/testdata/crds/samples.yaml")); err != nil {
		return err
	}

	work, err := os.MkdirTemp("", "bench-reconcile-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(work) }()
	bin := filepath.Join(work, "orchestra-operator")
	fmt.Fprintln(os.Stderr, "building cmd/orchestra-operator (CGO_ENABLED=0 -trimpath -ldflags=\"-s -w\", as make images) ...")
	if err := buildOperator(root, bin); err != nil {
		return fmt.Errorf("building the operator: %w", err)
	}
	// The baseline is built from a worktree of its revision, the same way.
	type operatorBuild struct{ label, bin string }
	builds := []operatorBuild{{"", bin}}
	if baseline != "" {
		src := filepath.Join(work, "baseline")
		fmt.Fprintf(os.Stderr, "building the baseline operator from %s ...\n", baseline)
		if out, err := exec.Command("git", "-C", root, "worktree", "add", "--detach", src, baseline).CombinedOutput(); err != nil {
			return fmt.Errorf("checking out %s: %w: %s", baseline, err, out)
		}
		defer func() { _ = exec.Command("git", "-C", root, "worktree", "remove", "--force", src).Run() }()
		bbin := filepath.Join(work, "orchestra-operator-baseline")
		if err := buildOperator(src, bbin); err != nil {
			return fmt.Errorf("building the baseline operator: %w", err)
		}
		builds = []operatorBuild{{"baseline " + baseline, bbin}, {"", bin}}
	}
	watchesFile := filepath.Join(work, "watches.yaml")
	if err := os.WriteFile(watchesFile, []byte("- {group: test.modelorchestra.io, version: v1, kind: Sample, chart: small}\n"), 0o600); err != nil {
		return err
	}

	// A fresh control plane serves its first custom resources slower (the
	// first of three batches of 50 in one cluster: 19 CRs/s; the next two:
	// 27-28, at the same CPU per resource): warm it up first, with an
	// operator process and namespace of its own, so that every measured
	// row pays only its own operator's start.
	if warmup > 0 {
		fmt.Fprintf(os.Stderr, "warming up the control plane with %d resources (not measured) ...\n", warmup)
		if _, err := benchOne(ctx, c, cluster, root, bin, watchesFile, warmup, workers, 0); err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
	}
	var results []result
	for range max(rounds, 1) {
		for _, f := range strings.Split(nList, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("bad -n value %q", f)
			}
			for _, b := range builds {
				r, err := benchOne(ctx, c, cluster, root, b.bin, watchesFile, n, workers, window)
				if err != nil {
					return fmt.Errorf("with %d resources (%s): %w", n, cmp.Or(b.label, "working tree"), err)
				}
				r.label = b.label
				results = append(results, r)
			}
		}
	}
	table := formatTable(results, workers)
	fmt.Print(table)
	if docs != "" {
		return updateDocs(docs, table, warmup)
	}
	return nil
}

// buildOperator builds cmd/orchestra-operator of the module in dir into
// bin as make images builds the operator's image: static, without cgo,
// symbol tables or DWARF. A default go build links libc and exports every
// symbol for the dynamic loader, which the shipped binary does not carry.
func buildOperator(dir, bin string) error {
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/orchestra-operator")
	build.Dir, build.Stdout, build.Stderr = dir, os.Stderr, os.Stderr
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	return build.Run()
}

func benchOne(ctx context.Context, c client.WithWatch, cluster *localcluster.Cluster, root, bin, watchesFile string, n, workers int, window time.Duration) (result, error) {
	res := result{n: n}
	ns := fmt.Sprintf("bench-%d-%d", n, time.Now().Unix())
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return res, err
	}
	metricsAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	probeAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	cmd := exec.Command(bin,
		"--watches-file", watchesFile,
		"--charts-dir", filepath.Join(root, "internal/helmreconciler/testdata/charts"),
		"--max-concurrent-reconciles", strconv.Itoa(workers),
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", probeAddr,
		"--reconcile-period", "1h",
		"--pprof",
		"--count-api-requests",
	)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cluster.KubeconfigFile(), "WATCH_NAMESPACE="+ns, "GOMAXPROCS="+strconv.Itoa(runtime.NumCPU()))
	logFile, err := os.Create(filepath.Join(os.TempDir(), "bench-reconcile-operator-"+strconv.Itoa(n)+".log"))
	if err != nil {
		return res, err
	}
	defer func() { _ = logFile.Close() }()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	launched := time.Now()
	if err := cmd.Start(); err != nil {
		return res, err
	}
	defer func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}()
	if err := waitMetrics(metricsAddr, 30*time.Second); err != nil {
		return res, fmt.Errorf("operator did not start (log %s): %w", logFile.Name(), err)
	}
	// The deploy phase measures reconciling, so it starts once the
	// operator's caches have synced (/readyz); the start-up before that
	// (informers' initial lists, which the API server may answer with 429
	// and a retry after 1 s) is reported in its own column.
	if err := waitReady(probeAddr, 30*time.Second); err != nil {
		return res, fmt.Errorf("operator not ready (log %s): %w", logFile.Name(), err)
	}
	res.ready = time.Since(launched)

	// The warm-up (no steady-state window) is not profiled: its profiles
	// would still run when the first measured row starts.
	if profileDir != "" && window > 0 {
		go fetchProfile(metricsAddr, filepath.Join(profileDir, fmt.Sprintf("install-%d.pprof", n)), 5)
		go fetchAPIServerProfile(cluster, filepath.Join(profileDir, fmt.Sprintf("apiserver-install-%d.pprof", n)), 5)
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		res.load = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	res.hashRate = sha256Rate()
	// Phase 1: create N resources, time until all are Deployed.
	before, err := scrape(metricsAddr)
	if err != nil {
		return res, err
	}
	cpuStart, err := processCPU(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	machineStart := machineCPU(cluster, cmd.Process.Pid)
	// Deployed conditions are counted from a watch, opened before the
	// first create: polling a list of N resources would load the API
	// server (and the shared CPUs) more the larger N is.
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(sampleGVK.GroupVersion().WithKind("SampleList"))
	w, err := c.Watch(ctx, list, client.InNamespace(ns))
	if err != nil {
		return res, fmt.Errorf("watching resources: %w", err)
	}
	defer w.Stop()
	start := time.Now()
	created := eachSample(ns, n, func(u *unstructured.Unstructured) error {
		u.Object["spec"] = map[string]any{"greeting": "hi", "clusterRole": false}
		return c.Create(ctx, u)
	})
	deployed := map[string]bool{}
	timeout := time.After(10 * time.Minute)
	for len(deployed) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return res, fmt.Errorf("watch closed with %d of %d Deployed", len(deployed), n)
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && isDeployed(u) {
				if len(deployed) == 0 {
					res.first = time.Since(start)
				}
				deployed[u.GetName()] = true
			}
		case <-timeout:
			return res, fmt.Errorf("only %d of %d Deployed after 10 minutes (log %s)", len(deployed), n, logFile.Name())
		}
	}
	if err := created(); err != nil {
		return res, fmt.Errorf("creating resources: %w", err)
	}
	res.deploy = time.Since(start)
	if cpuEnd, err := processCPU(cmd.Process.Pid); err == nil {
		res.installCPU = (cpuEnd - cpuStart) / time.Duration(n)
	}
	machineEnd := machineCPU(cluster, cmd.Process.Pid)
	res.cpuPerInstall = perInstallCPU(machineStart, machineEnd, n)
	res.machine = (machineEnd["machine"] - machineStart["machine"]) / time.Duration(n)
	if after, err := scrape(metricsAddr); err == nil {
		res.apiPerInstall = perInstall(before.api, after.api, n)
		res.reconcilesPerInstall = perInstall(before.reconciles, after.reconciles, n)
	}
	if window <= 0 {
		return res, nil // no steady-state phase
	}

	// Phase 2: steady state. Every resource now resyncs each second (the
	// reconcile-period annotation, set only now so that the deploy phase
	// runs with the operator's own period, --reconcile-period); nothing
	// changes, so every reconcile is a no-op. Measure the operator's CPU
	// over the window.
	if err := setPeriod(ctx, c, ns, n, "1s"); err != nil {
		return res, err
	}
	time.Sleep(3 * time.Second) // let the install tail and the annotation's reconciles settle
	m0, err := scrape(metricsAddr)
	if err != nil {
		return res, err
	}
	cpu0, err := processCPU(cmd.Process.Pid)
	if err != nil {
		return res, err
	}
	if profileDir != "" {
		go fetchProfile(metricsAddr, filepath.Join(profileDir, fmt.Sprintf("noop-%d.pprof", n)), int(min(window, 5*time.Second)/time.Second))
	}
	time.Sleep(window)
	cpu1, _ := processCPU(cmd.Process.Pid)
	m1, err := scrape(metricsAddr)
	if err != nil {
		return res, err
	}
	if m1.installs > 0 {
		res.installMean = m1.installSum / m1.installs
	}
	res.noopCount = m1.noops - m0.noops
	res.rendersNoop = m1.renders - m0.renders
	if res.noopCount > 0 {
		res.noopCPU = time.Duration(float64(cpu1-cpu0) / res.noopCount)
	}
	if res.noopCount > 0 {
		res.noopMean = fmt.Sprintf("%.2f ms", 1000*(m1.noopSum-m0.noopSum)/res.noopCount)
	}
	if profileDir != "" {
		fetchURL("http://"+metricsAddr+"/debug/pprof/heap", filepath.Join(profileDir, fmt.Sprintf("heap-%d.pprof", n)))
	}
	res.rssMiB, res.peakRSSMiB, err = processRSS(cmd.Process.Pid)
	res.anonMiB = anonRSS
	return res, err
}

// setPeriod sets the reconcile-period annotation on the n resources of ns.
func setPeriod(ctx context.Context, c client.Client, ns string, n int, period string) error {
	patch := []byte(`{"metadata":{"annotations":{"helm.sdk.operatorframework.io/reconcile-period":"` + period + `"}}}`)
	return eachSample(ns, n, func(u *unstructured.Unstructured) error {
		if err := c.Patch(ctx, u, client.RawPatch(types.MergePatchType, patch)); err != nil {
			return fmt.Errorf("setting the reconcile period of %s: %w", u.GetName(), err)
		}
		return nil
	})()
}

// eachSample calls f, 16 at a time, with each of the n resources of ns
// (s0000, s0001, ...: kind, namespace and name set). It returns at once; the
// returned function waits for all calls and returns the first error.
func eachSample(ns string, n int, f func(u *unstructured.Unstructured) error) (wait func() error) {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	wg.Go(func() {
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				u := &unstructured.Unstructured{Object: map[string]any{}}
				u.SetGroupVersionKind(sampleGVK)
				u.SetNamespace(ns)
				u.SetName(fmt.Sprintf("s%04d", i))
				if err := f(u); err != nil {
					errs <- err
				}
			})
		}
	})
	return func() error {
		wg.Wait()
		close(errs)
		return <-errs
	}
}

func isDeployed(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, raw := range conds {
		m, _ := raw.(map[string]any)
		if m["type"] == "Deployed" && m["status"] == "True" {
			return true
		}
	}
	return false
}

type metrics struct {
	noops, noopSum, renders, installs, installSum float64
	api                                           map[string]float64 // "verb resource" -> requests
	reconciles                                    map[string]float64 // outcome -> reconciles
}

func scrape(addr string) (metrics, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return metrics{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	m := metrics{api: map[string]float64{}, reconciles: map[string]float64{}}
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
		}
		if strings.HasPrefix(line, "orchestra_helm_reconcile_duration_seconds_count{") {
			m.reconciles[label(line, "outcome")] += val()
		}
	}
	return m, sc.Err()
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
	sort.Slice(keys, func(i, j int) bool { return b[keys[i]]-a[keys[i]] > b[keys[j]]-a[keys[j]] })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.2f", k, (b[k]-a[k])/float64(n)))
	}
	return fmt.Sprintf("%.2f: %s", total/float64(n), strings.Join(parts, ", "))
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

// anonRSS is the private (anonymous) part of the last processRSS reading;
// the rest is the executable's pages, shared and reclaimable.
var anonRSS float64

func processRSS(pid int) (rss, peak float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			rss = kb / 1024
		case "VmHWM:":
			peak = kb / 1024
		case "RssAnon:":
			anonRSS = kb / 1024
		}
	}
	return rss, peak, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

func waitMetrics(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/metrics"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("no /metrics endpoint")
}

func waitReady(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("/readyz did not answer 200")
}

func installCRD(ctx context.Context, c client.Client, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		return err
	}
	if err := c.Create(ctx, crd); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(crd), got); err == nil {
			for _, cond := range got.Status.Conditions {
				if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("CRD %s not established", crd.Name)
}

func formatTable(results []result, workers int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nHelm reconciler engine, chart of one ConfigMap + one Deployment, %d workers, local control plane (etcd + kube-apiserver + kube-controller-manager), %d CPUs\n\n", workers, runtime.NumCPU())
	b.WriteString("| CRs | operator start → ready | create → first Deployed | create → all Deployed | CRs/s | operator CPU per install | mean install reconcile | no-op reconciles measured | CPU per no-op reconcile | mean no-op reconcile | renders during no-ops | operator RSS (peak) | of which private | load average at start | machine speed: sha256 on one core |\n")
	b.WriteString("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %.2f s | %.0f ms | %.2f s | %.1f | %.1f ms | %.0f ms | %.0f | %.0f µs | %s | %.0f | %.0f MiB (%.0f MiB) | %.0f MiB | %s | %.0f MiB/s |\n",
			r.name(), r.ready.Seconds(), 1000*r.first.Seconds(), r.deploy.Seconds(), float64(r.n)/r.deploy.Seconds(), float64(r.installCPU.Microseconds())/1000, 1000*r.installMean, r.noopCount,
			float64(r.noopCPU.Microseconds()), r.noopMean, r.rendersNoop, r.rssMiB, r.peakRSSMiB, r.anonMiB, r.load, r.hashRate)
	}
	b.WriteString("\nPer custom resource from create to all Deployed (operator run with --count-api-requests):\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %s CRs: API requests %s; reconciles %s\n", r.name(), r.apiPerInstall, r.reconcilesPerInstall)
	}
	b.WriteString("\nCPU of the whole machine per custom resource from create to all Deployed, by process:\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %s CRs: %s\n", r.name(), r.cpuPerInstall)
	}
	// Each baseline row is followed by the same row of the working tree.
	var ratios []string
	for i := 0; i+1 < len(results); i++ {
		base, cur := results[i], results[i+1]
		if base.label == "" || cur.label != "" || base.n != cur.n {
			continue
		}
		ratios = append(ratios, fmt.Sprintf("| %d | %.2f | %.2f | %.2f |", cur.n,
			base.deploy.Seconds()/cur.deploy.Seconds(), cur.machine.Seconds()/base.machine.Seconds(), cur.installCPU.Seconds()/base.installCPU.Seconds()))
	}
	if len(ratios) > 0 {
		fmt.Fprintf(&b, "\nWorking tree against the %s, each pair measured back to back:\n\n", results[0].label)
		b.WriteString("| CRs | CRs/s, working tree ÷ baseline | machine CPU per CR, working tree ÷ baseline | operator CPU per install, working tree ÷ baseline |\n| ---: | ---: | ---: | ---: |\n")
		b.WriteString(strings.Join(ratios, "\n") + "\n")
	}
	return b.String()
}

// name is the row's name in the tables: the number of resources, and the
// baseline's revision on a baseline row.
func (r result) name() string {
	if r.label == "" {
		return strconv.Itoa(r.n)
	}
	return fmt.Sprintf("%d (%s)", r.n, r.label)
}

const (
	startMarker = "<!-- bench-reconcile:start -->"
	endMarker   = "<!-- bench-reconcile:end -->"
)

// updateDocs replaces the text between the markers, adding the section if
// the file has none.
func updateDocs(path, table string, warmup int) error {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	section := startMarker + "\nMeasured " + time.Now().UTC().Format("2006-01-02 15:04 UTC") +
		" by `go run ./hack/bench-reconcile " + strings.Join(os.Args[1:], " ") + "` (operator built from cmd/orchestra-operator as `make images` builds it: static, `-trimpath -ldflags=\"-s -w\"`; a new operator process for each row). " +
		fmt.Sprintf("Before the rows, %d resources were deployed in a namespace of their own, with an operator process of their own, and not measured: a fresh control plane serves its first resources slower.\n", warmup) + table +
		"\nCPU is the operator process's user+system time. \"Private\" RSS is RssAnon (heap, stacks); the rest of the RSS is pages of the executable (Helm's SDK brings in oras, kustomize, kubectl), shared and reclaimable. " +
		"The machine is shared with other builds and tests (see the load average): install latency is dominated by waiting (for the API server and for a CPU), not by the operator's own work (see the CPU per install); the whole process's CPU, informer and event handling included, is divided by the number of no-op reconciles. " +
		"The last column is how fast one core hashed with sha256 just before the run: the speed of this virtual machine varies from run to run, and the rate follows it.\n\n" +
		"Reference: the operator-sdk helm-operator deployed 50 CRs in 4.4–5.0 s (about 10/s) with an RSS of about 125 MiB. " +
		"Targets: at least 30 CRs/s to Deployed, a no-op reconcile under 1 ms of CPU that never renders, RSS under 100 MiB with 200 releases.\n" + endMarker
	s := string(data)
	i, j := strings.Index(s, startMarker), strings.Index(s, endMarker)
	if i >= 0 && j > i {
		s = s[:i] + section + s[j+len(endMarker):]
	} else {
		if s != "" && !strings.HasSuffix(s, "\n") {
			s += "\n"
		}
		s += "\n## Helm reconciler engine (make bench-reconcile)\n\n" + section + "\n"
	}
	return os.WriteFile(path, []byte(s), 0o644)
}
