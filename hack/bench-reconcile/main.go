// Command bench-reconcile measures the Helm reconciler engine on the local
// control plane, side by side with operator-framework's helm-operator-plugins:
// the time from creating N custom resources to all of them Deployed (timed
// from when the operator's caches have synced; its start-up time is reported
// apart), the operator's CPU and API requests per install, its CPU per no-op
// reconcile, and its memory.
//
// It builds cmd/orchestra-operator and runs it as a separate process (so
// that its CPU and RSS are its own) against etcd, kube-apiserver and
// kube-controller-manager from bin/, with a chart of one ConfigMap and one
// Deployment and 2 workers. Unless -peer=false, every row of ours is followed
// by the same row of the peer, as built by hack/tools/install.sh from its
// pinned module: at its defaults (controller-runtime's client rate limit of
// 20 requests/s, burst 30), and with the limit raised to ours (100, 200). It
// prints a table and the ratios and, with -docs, rewrites the bench-reconcile
// and bench-reconcile-peer sections of that markdown file.
//
//	go run ./hack/bench-reconcile -n 50,200 -docs docs/benchmarks.md
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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

// profileDir, when set, receives CPU profiles of our operator and of
// kube-apiserver.
var profileDir string

var sampleGVK = schema.GroupVersionKind{Group: "test.modelorchestra.io", Version: "v1", Kind: "Sample"}

type result struct {
	n       int
	subject subject
	deploy  time.Duration
	machine time.Duration // the machine's CPU per custom resource, create → all Deployed
	// benchCPU is the CPU per custom resource, create → all Deployed, of
	// the operator, the control plane and the benchmark client: the
	// machine's without the other work of a shared machine.
	benchCPU time.Duration
	first    time.Duration // create → the first resource Deployed
	// noopCount reconciles in the no-op window, which cost noopCPU each
	// (the operator process's CPU over the window) and took noopMean.
	noopCount float64
	noopCPU   time.Duration
	noopMean  time.Duration
	// rendersNoop is renders during the no-op window (ours only; want 0),
	// releasesNoop the release records written meanwhile (want 0).
	rendersNoop, releasesNoop float64
	mem                       memory
	installCPU                time.Duration // operator CPU per CR during the deploy phase
	reconcileMean             time.Duration // mean reconcile from create to all Deployed
	requests                  float64       // API requests per CR from create to all Deployed
	load                      string        // /proc/loadavg when the row started
	ready                     time.Duration // operator start → caches synced and workers started
	// Per custom resource, from create to all Deployed: API requests (by
	// verb and resource for ours, by method and code for the peer), and
	// reconciles by outcome (ours) or result (the peer).
	apiPerInstall, reconcilesPerInstall string
	// serverPerInstall is the requests kube-apiserver served per custom
	// resource from create to all Deployed, from every client.
	serverPerInstall string
	// eventsPerInstall is the events in the row's namespace at its end, by
	// reporting component and reason, per custom resource.
	eventsPerInstall string
	// cpuPerInstall is the machine's CPU per custom resource from create
	// to all Deployed, by process.
	cpuPerInstall string
	// hashRate is sha256 MiB/s on one core just before the row: how fast
	// the machine was (a virtual machine's speed varies).
	hashRate float64
}

func main() {
	ns := flag.String("n", "50,200", "comma-separated numbers of custom resources")
	workers := flag.Int("workers", 2, "reconcile workers")
	window := flag.Duration("noop-window", 10*time.Second, "how long to measure no-op reconciles")
	warmup := flag.Int("warmup", 20, "resources deployed (and not measured) before the measured runs, to warm the control plane; 0: none")
	docs := flag.String("docs", "", "rewrite the bench-reconcile (and, with the peer, bench-reconcile-peer) sections of this markdown file")
	baseline := flag.String("baseline", "", "also measure the operator built from this git revision, each row right before the same row of the working tree's, and print the ratios")
	withPeer := flag.Bool("peer", true, "also measure helm-operator-plugins (bin/helm-operator and bin/helm-operator-tuned, from make tools), each row right after the same row of ours, and print the ratios")
	rounds := flag.Int("rounds", 1, "measure every row this many times")
	flag.StringVar(&profileDir, "profile-dir", "", "write CPU profiles of our operator here")
	flag.Parse()
	if err := run(*ns, *workers, *warmup, *rounds, *window, *docs, *baseline, *withPeer); err != nil {
		fmt.Fprintln(os.Stderr, "bench-reconcile:", err)
		os.Exit(1)
	}
}

func run(nList string, workers, warmup, rounds int, window time.Duration, docs, baseline string, withPeer bool) error {
	var counts []int
	for _, f := range strings.Split(nList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("bad -n value %q", f)
		}
		counts = append(counts, n)
	}
	root, err := localcluster.ModuleRoot()
	if err != nil {
		return err
	}
	var peers []subject
	if withPeer {
		if peers, err = peerSubjects(filepath.Join(root, "bin")); err != nil {
			return err
		}
	}
	ctx := context.Background()
	fmt.Fprintf(os.Stderr, "load average %s; starting the local control plane ...\n", loadAverage())
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
	ours := subject{name: "ours", kind: orchestra, bin: bin}
	// The baseline is built from a worktree of its revision, the same way.
	subjects := []subject{ours}
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
		subjects = []subject{{name: "baseline " + baseline, kind: orchestra, bin: bbin}, ours}
	}
	subjects = append(subjects, peers...)
	st, err := writeWatchFiles(work, filepath.Join(root, "internal/helmreconciler/testdata/charts"))
	if err != nil {
		return err
	}
	st.kubeconfig = cluster.KubeconfigFile()

	// A fresh control plane serves its first custom resources slower (the
	// first of three batches of 50 in one cluster: 19 CRs/s; the next two:
	// 27-28, at the same CPU per resource): warm it up first, with an
	// operator process and namespace of its own, so that every measured
	// row pays only its own operator's start.
	if warmup > 0 {
		fmt.Fprintf(os.Stderr, "warming up the control plane with %d resources (not measured) ...\n", warmup)
		if _, err := benchOne(ctx, c, cluster, ours, st, warmup, workers, 0); err != nil {
			return fmt.Errorf("warming up: %w", err)
		}
	}
	var results []result
	for range max(rounds, 1) {
		for _, n := range counts {
			for _, s := range subjects {
				fmt.Fprintf(os.Stderr, "%d resources, %s (load average %s) ...\n", n, s.name, loadAverage())
				r, err := benchOne(ctx, c, cluster, s, st, n, workers, window)
				if err != nil {
					return fmt.Errorf("with %d resources (%s): %w", n, s.name, err)
				}
				results = append(results, r)
			}
		}
	}
	table := formatTable(results, workers)
	fmt.Print(table)
	var peerTable string
	if withPeer {
		peerTable = formatPeerTable(results)
		fmt.Print(peerTable)
	}
	if docs != "" {
		return updateDocs(docs, table, peerTable, warmup)
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

// rowSeq numbers the rows' namespaces.
var rowSeq int

// benchOne measures s with n resources in a namespace of its own. With a
// window, it also measures no-op reconciles: every resource resyncs each
// second and nothing changes.
func benchOne(ctx context.Context, c client.WithWatch, cluster *localcluster.Cluster, s subject, st setup, n, workers int, window time.Duration) (res result, err error) {
	res = result{n: n, subject: s}
	rowSeq++
	ns := fmt.Sprintf("bench-%d-%s-%d-%d", n, shortName(s), rowSeq, time.Now().Unix())
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return res, err
	}
	logName := fmt.Sprintf("bench-reconcile-%s-%d.log", shortName(s), n)
	op, err := startOperator(s, st, ns, workers, "1h", logName)
	if err != nil {
		return res, err
	}
	defer func() { op.stop() }()
	res.ready = time.Since(op.started)

	// The warm-up (no steady-state window) is not profiled: its profiles
	// would still run when the first measured row starts.
	if profileDir != "" && window > 0 && s.kind == orchestra {
		go fetchProfile(op.metricsAddr, filepath.Join(profileDir, fmt.Sprintf("install-%d.pprof", n)), 5)
		go fetchAPIServerProfile(cluster, filepath.Join(profileDir, fmt.Sprintf("apiserver-install-%d.pprof", n)), 5)
	}
	res.load = loadAverage()
	res.hashRate = sha256Rate()
	if err := deploy(ctx, c, cluster, op, ns, n, &res); err != nil {
		return res, err
	}
	if window <= 0 {
		return res, nil // no steady-state phase
	}

	// Phase 2: steady state. Every resource now resyncs each second and
	// nothing changes, so every reconcile is a no-op. Measure the
	// operator's CPU over the window.
	releases0, err := releaseRecords(ctx, c, ns)
	if err != nil {
		return res, err
	}
	installMem, err := processMemory(op.pid())
	if err != nil {
		return res, err
	}
	switch s.kind {
	case orchestra:
		// The reconcile-period annotation is set only now, so that the
		// deploy phase runs with the operator's own period.
		if err := setPeriod(ctx, c, ns, n, "1s"); err != nil {
			return res, err
		}
	case peer:
		// The peer has no per-resource period: a new process of it, with
		// --reconcile-period 1s, takes over the deployed releases. Its
		// first reconcile of each is a no-op like the following ones.
		op.stop()
		if op, err = startOperator(s, st, ns, workers, "1s", strings.TrimSuffix(logName, ".log")+"-noop.log"); err != nil {
			return res, err
		}
	}
	time.Sleep(3 * time.Second) // let the install tail, the annotation's reconciles or the start settle
	if err := noops(op, n, window, &res); err != nil {
		return res, err
	}
	releases1, err := releaseRecords(ctx, c, ns)
	if err != nil {
		return res, err
	}
	res.releasesNoop = float64(releases1 - releases0)
	if res.mem, err = processMemory(op.pid()); err != nil {
		return res, err
	}
	res.mem.peak = max(res.mem.peak, installMem.peak)
	res.eventsPerInstall, err = eventsPerInstall(ctx, c, ns, n)
	return res, err
}

// deploy creates n resources in ns and waits until all are Deployed
// (phase 1), filling in the deploy-phase fields of res.
func deploy(ctx context.Context, c client.WithWatch, cluster *localcluster.Cluster, op *operator, ns string, n int, res *result) error {
	before, err := scrape(op.metricsAddr)
	if err != nil {
		return err
	}
	cpuStart, err := processCPU(op.pid())
	if err != nil {
		return err
	}
	machineStart := machineCPU(cluster, op.pid())
	hc, err := rest.HTTPClientFor(cluster.Config())
	if err != nil {
		return err
	}
	server0, err := apiServerRequests(hc, cluster.APIServerURL())
	if err != nil {
		return err
	}
	// Deployed conditions are counted from a watch, opened before the
	// first create: polling a list of N resources would load the API
	// server (and the shared CPUs) more the larger N is.
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(sampleGVK.GroupVersion().WithKind("SampleList"))
	w, err := c.Watch(ctx, list, client.InNamespace(ns))
	if err != nil {
		return fmt.Errorf("watching resources: %w", err)
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
				return fmt.Errorf("watch closed with %d of %d Deployed", len(deployed), n)
			}
			if u, ok := ev.Object.(*unstructured.Unstructured); ok && isDeployed(u) {
				if len(deployed) == 0 {
					res.first = time.Since(start)
				}
				deployed[u.GetName()] = true
			}
		case <-timeout:
			return fmt.Errorf("only %d of %d Deployed after 10 minutes (log %s)", len(deployed), n, op.log.Name())
		}
	}
	if err := created(); err != nil {
		return fmt.Errorf("creating resources: %w", err)
	}
	res.deploy = time.Since(start)
	if cpuEnd, err := processCPU(op.pid()); err == nil {
		res.installCPU = (cpuEnd - cpuStart) / time.Duration(n)
	}
	machineEnd := machineCPU(cluster, op.pid())
	res.cpuPerInstall = perInstallCPU(machineStart, machineEnd, n)
	res.machine = (machineEnd["machine"] - machineStart["machine"]) / time.Duration(n)
	for name, end := range machineEnd {
		if name != "machine" {
			res.benchCPU += (end - machineStart[name]) / time.Duration(n)
		}
	}
	server1, err := apiServerRequests(hc, cluster.APIServerURL())
	if err != nil {
		return err
	}
	res.serverPerInstall = perInstall(server0, server1, n)
	after, err := scrape(op.metricsAddr)
	if err != nil {
		return err
	}
	if count := after.crReconcileCount - before.crReconcileCount; count > 0 {
		res.reconcileMean = time.Duration(float64(time.Second) * (after.crReconcileSum - before.crReconcileSum) / count)
	}
	switch op.kind {
	case orchestra:
		// Counted in the transport, below the prefetcher, which answers
		// reads of objects the cache shows absent without a request:
		// client-go counts those answers too (as GET 404).
		res.requests = growth(before.api, after.api) / float64(n)
		res.apiPerInstall = perInstall(before.api, after.api, n) + "; client-go counted " + perInstall(before.requests, after.requests, n)
		res.reconcilesPerInstall = perInstall(before.reconciles, after.reconciles, n)
	case peer:
		res.requests = (after.requestsTotal - before.requestsTotal) / float64(n)
		res.apiPerInstall = perInstall(before.requests, after.requests, n)
		res.reconcilesPerInstall = perInstall(before.crReconciles, after.crReconciles, n)
	}
	return nil
}

// noops measures the operator's reconciles over window and its CPU per
// reconcile. Ours counts its no-op reconciles (and renders) itself; every
// reconcile of the peer in the window is one, as nothing changes.
func noops(op *operator, n int, window time.Duration, res *result) error {
	m0, err := scrape(op.metricsAddr)
	if err != nil {
		return err
	}
	cpu0, err := processCPU(op.pid())
	if err != nil {
		return err
	}
	if profileDir != "" && op.kind == orchestra {
		go fetchProfile(op.metricsAddr, filepath.Join(profileDir, fmt.Sprintf("noop-%d.pprof", n)), int(min(window, 5*time.Second)/time.Second))
	}
	time.Sleep(window)
	cpu1, err := processCPU(op.pid())
	if err != nil {
		return err
	}
	m1, err := scrape(op.metricsAddr)
	if err != nil {
		return err
	}
	var seconds float64
	switch op.kind {
	case orchestra:
		res.noopCount, seconds = m1.noops-m0.noops, m1.noopSum-m0.noopSum
		res.rendersNoop = m1.renders - m0.renders
	case peer:
		res.noopCount, seconds = m1.crReconcilesTotal()-m0.crReconcilesTotal(), m1.crReconcileSum-m0.crReconcileSum
		res.rendersNoop = -1 // not counted
	}
	if res.noopCount > 0 {
		res.noopCPU = time.Duration(float64(cpu1-cpu0) / res.noopCount)
		res.noopMean = time.Duration(float64(time.Second) * seconds / res.noopCount)
	}
	if profileDir != "" && op.kind == orchestra {
		fetchURL("http://"+op.metricsAddr+"/debug/pprof/heap", filepath.Join(profileDir, fmt.Sprintf("heap-%d.pprof", n)))
	}
	return nil
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
	b.WriteString("| CRs | operator | operator start → ready | create → first Deployed | create → all Deployed | CRs/s | operator CPU per install | API requests per install | mean reconcile while installing | no-op reconciles measured | CPU per no-op reconcile | mean no-op reconcile | renders during no-ops | release records written during no-ops | operator RSS (peak) | of which private | load average at start | machine speed: sha256 on one core |\n")
	b.WriteString("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range results {
		renders := "—"
		if r.rendersNoop >= 0 {
			renders = fmt.Sprintf("%.0f", r.rendersNoop)
		}
		fmt.Fprintf(&b, "| %d | %s | %.2f s | %.0f ms | %.2f s | %.1f | %.1f ms | %.2f | %.0f ms | %.0f | %s | %.2f ms | %s | %.0f | %.0f MiB (%.0f MiB) | %.0f MiB | %s | %.0f MiB/s |\n",
			r.n, r.subject.name, r.ready.Seconds(), 1000*r.first.Seconds(), r.deploy.Seconds(), r.rate(), float64(r.installCPU.Microseconds())/1000, r.requests,
			1000*r.reconcileMean.Seconds(), r.noopCount, formatCPU(r.noopCPU), 1000*r.noopMean.Seconds(), renders, r.releasesNoop,
			r.mem.rss, r.mem.peak, r.mem.anon, r.load, r.hashRate)
	}
	b.WriteString("\nPer custom resource from create to all Deployed: API requests (ours: by verb and resource, counted in its HTTP transport with --count-api-requests, then client-go's count, which includes the reads its prefetcher answers from the cache without a request, as GET 404; the peer: by method and status code, from client-go's rest_client_requests_total); reconciles (ours: by outcome; the peer: by controller-runtime result):\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %d, %s: API requests %s; reconciles %s\n", r.n, r.subject.name, r.apiPerInstall, r.reconcilesPerInstall)
	}
	b.WriteString("\nRequests kube-apiserver served per custom resource from create to all Deployed, from every client (the operator, kube-controller-manager, the benchmark's creates and watch), by verb, resource and code:\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %d, %s: %s\n", r.n, r.subject.name, r.serverPerInstall)
	}
	b.WriteString("\nEvents in the row's namespace at its end, per custom resource, by reporting component and reason:\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %d, %s: %s\n", r.n, r.subject.name, r.eventsPerInstall)
	}
	b.WriteString("\nCPU of the whole machine per custom resource from create to all Deployed, by process:\n\n")
	for _, r := range results {
		fmt.Fprintf(&b, "- %d, %s: %s\n", r.n, r.subject.name, r.cpuPerInstall)
	}
	// Each baseline row is followed by the same row of the working tree.
	var ratios []string
	for i := 0; i+1 < len(results); i++ {
		base, cur := results[i], results[i+1]
		if !strings.HasPrefix(base.subject.name, "baseline") || cur.subject.name != "ours" || base.n != cur.n {
			continue
		}
		ratios = append(ratios, fmt.Sprintf("| %d | %.2f | %.2f | %.2f |", cur.n,
			base.deploy.Seconds()/cur.deploy.Seconds(), cur.machine.Seconds()/base.machine.Seconds(), cur.installCPU.Seconds()/base.installCPU.Seconds()))
	}
	if len(ratios) > 0 {
		fmt.Fprintf(&b, "\nWorking tree against the %s, each pair measured back to back:\n\n", results[0].subject.name)
		b.WriteString("| CRs | CRs/s, working tree ÷ baseline | machine CPU per CR, working tree ÷ baseline | operator CPU per install, working tree ÷ baseline |\n| ---: | ---: | ---: | ---: |\n")
		b.WriteString(strings.Join(ratios, "\n") + "\n")
	}
	return b.String()
}

func (r result) rate() float64 { return float64(r.n) / r.deploy.Seconds() }

func formatCPU(d time.Duration) string {
	if d >= 10*time.Millisecond {
		return fmt.Sprintf("%.0f ms", float64(d.Microseconds())/1000)
	}
	return fmt.Sprintf("%.0f µs", float64(d.Microseconds()))
}

// The targets against the tuned peer, from the issue that added it.
const (
	targetThroughput = 5.0   // ours ÷ peer, CRs/s to Deployed
	targetNoop       = 100.0 // peer ÷ ours, CPU per no-op reconcile
	targetPeakRSS    = 1.0   // peer ÷ ours, more than this
)

// formatPeerTable prints, for each row of ours, the ratios to the peer's
// rows measured right after it with the same number of resources, and how
// many rows meet the targets against the tuned peer.
func formatPeerTable(results []result) string {
	var b strings.Builder
	b.WriteString("\nOurs against helm-operator-plugins, each row of ours measured right before the peer's rows with the same resources (higher is better for ours):\n\n")
	b.WriteString("| CRs | against | CRs/s to Deployed: ours ÷ peer | CPU per no-op reconcile: peer ÷ ours | peak RSS: peer ÷ ours | operator CPU per install: peer ÷ ours | API requests per install: peer ÷ ours | CPU of operator + control plane per install: peer ÷ ours |\n")
	b.WriteString("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	type tally struct{ met, rows int }
	var throughput, noop, rss tally
	count := func(t *tally, ok bool) {
		t.rows++
		if ok {
			t.met++
		}
	}
	for i, o := range results {
		if o.subject.name != "ours" {
			continue
		}
		for _, p := range results[i+1:] {
			if p.subject.kind != peer || p.n != o.n {
				break
			}
			t, nr, rr := o.rate()/p.rate(), ratio(p.noopCPU, o.noopCPU), p.mem.peak/o.mem.peak
			fmt.Fprintf(&b, "| %d | %s | %.2f | %s | %.2f | %.1f | %.1f | %.1f |\n", o.n, p.subject.name, t, formatRatio(nr), rr,
				ratio(p.installCPU, o.installCPU), p.requests/o.requests, ratio(p.benchCPU, o.benchCPU))
			if len(p.subject.args) > 0 {
				count(&throughput, t >= targetThroughput)
				count(&noop, nr >= targetNoop)
				count(&rss, rr > targetPeakRSS)
			}
		}
	}
	if throughput.rows > 0 {
		fmt.Fprintf(&b, "\nTargets against the tuned peer (QPS 100, burst 200): install throughput ≥ %.0f×: met in %d of %d rows; CPU per no-op reconcile ≥ %.0f× less: %d of %d; lower peak RSS: %d of %d.\n",
			targetThroughput, throughput.met, throughput.rows, targetNoop, noop.met, noop.rows, rss.met, rss.rows)
	}
	return b.String()
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func formatRatio(r float64) string {
	if r >= 10 {
		return fmt.Sprintf("%.0f", r)
	}
	return fmt.Sprintf("%.1f", r)
}

const (
	startMarker     = "<!-- bench-reconcile:start -->"
	endMarker       = "<!-- bench-reconcile:end -->"
	peerStartMarker = "<!-- bench-reconcile-peer:start -->"
	peerEndMarker   = "<!-- bench-reconcile-peer:end -->"
)

// updateDocs replaces the text between the markers of the bench-reconcile
// section and, with a peer table, of the bench-reconcile-peer section,
// adding a section the file does not have at its end.
func updateDocs(path, table, peerTable string, warmup int) error {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	measured := "Measured by `go run ./hack/bench-reconcile " + strings.Join(os.Args[1:], " ") + "`"
	section := measured + " (our operator built from cmd/orchestra-operator as `make images` builds it: static, `-trimpath -ldflags=\"-s -w\"`; a new operator process for each row). " +
		fmt.Sprintf("Before the rows, %d resources were deployed in a namespace of their own, with an operator process of their own, and not measured: a fresh control plane serves its first resources slower.\n", warmup) + table +
		"\nCPU is the operator process's user+system time. API requests per install are the requests sent to the API server: ours as its transport counts them, the peer's as client-go counts them (rest_client_requests_total; the peer answers no request itself). \"Private\" RSS is RssAnon (heap, stacks); the rest of the RSS is pages of the executable (Helm's SDK brings in oras, kustomize, kubectl), shared and reclaimable. " +
		"The machine is shared with other builds and tests (see the load average): install latency is dominated by waiting (for the API server and for a CPU), not by the operator's own work (see the CPU per install); the whole process's CPU, informer and event handling included, is divided by the number of no-op reconciles. " +
		"The last column is how fast one core hashed with sha256 just before the row: the speed of this virtual machine varies from run to run, and the rate follows it.\n\n" +
		"Targets: at least 30 CRs/s to Deployed, a no-op reconcile under 1 ms of CPU that never renders, RSS under 100 MiB with 200 releases.\n"
	s := replaceSection(string(data), startMarker, endMarker, section, "Helm reconciler engine (make bench-reconcile)")
	if peerTable != "" {
		peerSection := measured + ", in the same run as the table above.\n" + peerTable +
			"\nThe peer is operator-framework's helm-operator-plugins v0.8.0, pinned in hack/tools/helm-operator-plugins and built by `make tools` as its image builds it (static, `-trimpath -ldflags=\"-s -w\"`): " +
			"\"peer\" is the module's own `helm-operator run` command at its defaults, whose client is limited to controller-runtime's 20 requests/s with bursts of 30 (the command has no flag or variable for it); " +
			"\"peer, QPS 100 burst 200\" is the same command built from the library's packages with that limit raised to ours (hack/tools/helm-operator-plugins/tuned), as a user of the library would. " +
			"Both reconcile the same chart (from its directory) with the same workers, and the ours row right before them ran on the same control plane. " +
			"The peer has no per-resource reconcile period, so its no-op phase is a second process of it with --reconcile-period 1s taking over the deployed releases (its peak RSS is the larger of the two processes'); nothing changes, so every reconcile in the window should be a no-op: the column of release records written during no-ops shows whether one was not.\n"
		s = replaceSection(s, peerStartMarker, peerEndMarker, peerSection, "Side by side with helm-operator-plugins (make bench-reconcile)")
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// replaceSection replaces the text between start and end in s, or adds
// the section under a heading at the end.
func replaceSection(s, start, end, body, heading string) string {
	section := start + "\n" + body + end
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i >= 0 && j > i {
		return s[:i] + section + s[j+len(end):]
	}
	if s != "" && !strings.HasSuffix(s, "\n") {
		s += "\n"
	}
	return s + "\n## " + heading + "\n\n" + section + "\n"
}
