package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/modelgen"
	"github.com/model-orchestra/operator/internal/nodeagent"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/ssetest"
	"github.com/model-orchestra/operator/internal/tierprobe"
)

var (
	zeroCopyBench  = flag.Bool("zero-copy-bench", false, "measure a parked real Ollama application's wake from zero with the node agent holding its verified hot copy, its warm copy, or no copy (make bench-tiers-ollama-zero)")
	zeroCopySize   = flag.String("zero-copy-size", "256MiB", "size of the generated GGUF model")
	zeroCopyRounds = flag.Int("zero-copy-rounds", 3, "rounds; each wakes the parked application once with its hot copy, once with its warm copy and once without a copy, the order rotating")
	zeroCopyDocs   = flag.String("zero-copy-docs", "", "Markdown file whose bench-tiers-ollama-zero section receives the table")
)

const (
	zeroCopyStart = "<!-- bench-tiers-ollama-zero:start -->"
	zeroCopyEnd   = "<!-- bench-tiers-ollama-zero:end -->"
	// zeroCopyWith, zeroCopyWarm and zeroCopyWithout name the cases.
	zeroCopyWith    = "hot copy on the node"
	zeroCopyWarm    = "warm copy on the node (hot moved down)"
	zeroCopyWithout = "no copy (dropped)"
)

// zeroWake is one wake from zero of the parked application.
type zeroWake struct {
	kind string
	// ttft is the wake's chat, sent to the parked application, to its
	// first non-empty content; loaded the same chat right after, the
	// model loaded.
	ttft, loaded time.Duration
	// ready is the status's lastWake.seconds: first request to a ready
	// root.
	ready time.Duration
	// fromTier and bytes are the status's lastWake.
	fromTier v1alpha1.Tier
	bytes    int64
	// probe is the fastest read of the file the wake should load (the
	// hot copy, or the model cache's file), right before and right after.
	probe nodeapi.Bandwidth
}

// physical is the bytes at the tier probe's rate: the read the wake
// cannot avoid.
func (w zeroWake) physical() time.Duration { return tierprobe.Bound(w.bytes, w.probe) }

// TestZeroCopyBenchmark (issue 27 §6) measures what a copy on the node
// saves a wake from zero, like for like on the one real node: the same
// parked Ollama application (minReplicas 0, parkAfter, the dispatcher
// granted patch on nodes), woken by a chat from zero, (a) with the node
// agent holding its verified hot copy, (b) after both its copies were
// removed through the agent's API (DELETE /tiers/{tier}/{ns}/{name}), so
// the engine loads the model cache's file, dropped from the page cache
// as a node without a copy would find it. The two alternate each round.
// Each wake's time to first non-empty content, the status's tier, and the
// physical part: the bytes at the tier probe's rate of the very file the
// wake loads.
func TestZeroCopyBenchmark(t *testing.T) {
	if !*zeroCopyBench {
		t.Skip("a benchmark: make bench-tiers-ollama-zero runs it (-zero-copy-bench)")
	}
	requireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute+time.Duration(*zeroCopyRounds)*6*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "bench-zero-copy")
	const name, app = "zerocopy", "ollama"
	start := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("[%4.0fs] "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}
	size, err := modelgen.ParseSize(*zeroCopySize)
	if err != nil {
		t.Fatal(err)
	}
	hub, n := startLargeMirror(t, size)
	grantNodePatch(ctx, t, ns, name+"-dispatcher")
	token, err := stack.EnsureToken(ctx, env.cs, ns, "bench-token")
	if err != nil {
		t.Fatal(err)
	}
	obj := ollamaTiersResource(t, ns, name, app, map[string]any{"minReplicas": int64(0), "zeroAfter": "1h", "parkAfter": "10s", "maxWait": "5m"})
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{
		"source": "hf://" + benchLargeRepo, "hubEndpoint": hub, "format": "gguf", "file": benchLargeFile,
		"cache": map[string]any{"size": fmt.Sprintf("%dMi", n*2>>20+64), "accessMode": "ReadWriteMany"},
	}, "spec", "applications", app, "model"))
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	served := ollamaServed(app)
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, "hello", 4, nil, time.Minute); err != nil {
		t.Fatalf("first chat: %v", err)
	}
	prompt, err := zeroCopyPrompt(ctx, base, token, served)
	if err != nil {
		t.Fatal(err)
	}
	logf("Ready, the model answers %q", prompt)
	root := appRoot(ctx, t, ns, name, app)
	node := root.Spec.NodeName
	agent := nodeapi.Client{URL: nodeAgentURL(ctx, t, ns, name, node), HTTP: http.DefaultClient, Token: agentCallerToken(ctx, t, ns, name)}
	copyName := name + "-" + app
	hotFile := filepath.Join(tierDirs(t)[0], ns, copyName)
	warmFile := filepath.Join(tierDirs(t)[1], ns, copyName)
	coldFile := modelCacheFile(ctx, t, ns, benchLargeFile, n)

	// Every probe reads into one region kept for the run, as large as the
	// file, pre-faulted in huge pages (tierprobe: the kind of memory a
	// load lands in).
	dst, err := arena.New(n, arena.Options{Pages: arena.PagesHuge})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Free()
	hotProbes := []*tierprobe.Probe{
		tierprobe.Of("hot", hotFile, dst, arena.FileOptions{Method: arena.ReadMapped}),
		tierprobe.Of("hot", hotFile, dst, arena.FileOptions{Method: arena.ReadPread}),
	}
	diskProbes := func(tier, path string) []*tierprobe.Probe {
		buffered := tierprobe.Of(tier, path, dst, arena.FileOptions{Method: arena.ReadPread})
		buffered.DropCache = true
		return []*tierprobe.Probe{buffered, tierprobe.Of(tier, path, dst, arena.FileOptions{Direct: true})}
	}
	warmProbes, coldProbes := diskProbes("warm", warmFile), diskProbes("cold", coldFile)

	loadBefore := loadAverage()
	var wakes []zeroWake
	kinds := []string{zeroCopyWith, zeroCopyWarm, zeroCopyWithout}
	for round := range *zeroCopyRounds {
		for k := range kinds {
			kind := kinds[(round+k)%len(kinds)]
			waitParked(ctx, t, ns, name, app, node)
			probes := hotProbes
			switch kind {
			case zeroCopyWithout:
				dropCopies(ctx, t, agent, ns, copyName)
				probes = coldProbes
			case zeroCopyWarm:
				// The agent moves its hot copy down to the warm tier
				// (verified, the hot copy released), as it does when
				// the hot budget needs the room.
				var res nodeapi.DemoteResult
				if err := agent.Call(ctx, http.MethodPost, nodeapi.PathDemote, nodeapi.DemoteRequest{Key: nodeapi.Key{Namespace: ns, Name: copyName}}, &res); err != nil {
					logf("round %d: moving the hot copy to the warm tier: %v", round+1, err)
				}
				if _, ok := agentCopy(ctx, t, agent.URL, ns, copyName, v1alpha1.TierHot); ok {
					_ = agent.Call(ctx, http.MethodDelete, fmt.Sprintf("%s/%s/%s/%s", nodeapi.PathTiers, v1alpha1.TierHot, ns, copyName), nil, nil)
				}
				if _, ok := agentCopy(ctx, t, agent.URL, ns, copyName, v1alpha1.TierWarm); !ok {
					logf("round %d: no warm copy on %s", round+1, node)
				}
				probes = warmProbes
			}
			if _, ok := agentCopy(ctx, t, agent.URL, ns, copyName, v1alpha1.TierHot); kind == zeroCopyWith && !ok {
				// The table's "from" column says which tier it woke from.
				logf("round %d: parked without a hot copy on %s", round+1, node)
			}
			before, err := probePeakOf(probes)
			if err != nil {
				logf("round %d, %s: the probe before the wake: %v", round+1, kind, err)
			}
			// The model cache's file and a warm copy are read from the
			// disk, not from the page cache, in every case, as a node
			// finds them after a while.
			if err := nodeagent.DropCache(coldFile); err != nil {
				t.Fatal(err)
			}
			if kind == zeroCopyWarm {
				_ = nodeagent.DropCache(warmFile)
			}
			w := zeroWake{kind: kind}
			sent := time.Now()
			if w.ttft, err = zeroCopyChat(ctx, base, token, served, prompt); err != nil {
				t.Fatalf("round %d, %s: the chat that wakes it: %v", round+1, kind, err)
			}
			if w.loaded, err = zeroCopyChat(ctx, base, token, served, prompt); err != nil {
				t.Fatalf("round %d, %s: the chat after the wake: %v", round+1, kind, err)
			}
			after, err := probePeakOf(probes)
			if err != nil {
				logf("round %d, %s: the probe after the wake: %v", round+1, kind, err)
			}
			w.probe = tierprobe.Peak(append(before, after...)...)
			eventually(t, 30*time.Second, func() error {
				st, err := appStatus(ctx, ns, name, app)
				if err != nil {
					return err
				}
				lc := st.Lifecycle
				if lc == nil || lc.State != v1alpha1.LifecycleAwake || lc.LastWake == nil || lc.LastWake.Seconds == "" ||
					lc.LastWake.StartTime == nil || lc.LastWake.StartTime.Time.Before(sent.Add(-2*time.Second)) {
					return fmt.Errorf("lifecycle %s; want Awake with the record of the wake sent at %s", lifecycleJSON(lc), sent.UTC().Format(time.RFC3339))
				}
				w.fromTier, w.bytes = lc.LastWake.FromTier, lc.LastWake.Bytes
				d, err := time.ParseDuration(lc.LastWake.Seconds + "s")
				w.ready = d
				return err
			})
			if w.bytes == 0 {
				w.bytes = n
			}
			if woken := appRoot(ctx, t, ns, name, app); woken.Spec.NodeName != node {
				t.Fatalf("round %d: woken onto %s, want %s (the one real node)", round+1, woken.Spec.NodeName, node)
			}
			logf("round %d, %s: first token %v (loaded %v), ready after %v, from %s (%d bytes), probe %s GB/s (%s), bytes ÷ probe %v",
				round+1, kind, w.ttft.Round(time.Millisecond), w.loaded.Round(time.Millisecond), w.ready, w.fromTier, w.bytes,
				fmt.Sprintf("%.2f", w.probe.BytesPerSecond/1e9), w.probe.Method, w.physical().Round(time.Millisecond))
			wakes = append(wakes, w)
		}
	}
	table := zeroCopyTable(wakes, n, loadBefore, loadAverage(), time.Since(start))
	t.Log("\n" + table)
	if *zeroCopyDocs != "" {
		path := *zeroCopyDocs
		if !filepath.IsAbs(path) {
			path = filepath.Join(env.root, path)
		}
		if err := writeMarked(path, zeroCopyStart, zeroCopyEnd, table); err != nil {
			t.Error(err)
		}
	}
}

// grantNodePatch grants the service account patch on nodes, as the
// cluster administrator does for the dispatcher that parks applications
// (docs/lifecycle.md, "Parking"), until the test ends.
func grantNodePatch(ctx context.Context, t *testing.T, ns, serviceAccount string) {
	t.Helper()
	grant := "bench-park-nodes-" + ns
	_, err := env.cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: grant},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"patch"}}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = env.cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: grant},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: grant},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: serviceAccount, Namespace: ns}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = env.cs.RbacV1().ClusterRoleBindings().Delete(ctx, grant, metav1.DeleteOptions{})
		_ = env.cs.RbacV1().ClusterRoles().Delete(ctx, grant, metav1.DeleteOptions{})
		nodes, _ := env.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		for _, nd := range nodes.Items {
			for k := range nd.Labels {
				if strings.HasPrefix(k, v1alpha1.WeightsNodeLabelPrefix+ns+".") {
					_, _ = env.cs.CoreV1().Nodes().Patch(ctx, nd.Name, "application/merge-patch+json", fmt.Appendf(nil, `{"metadata":{"labels":{%q:null}}}`, k), metav1.PatchOptions{})
				}
			}
		}
	})
}

// agentCallerToken is the release's node agent caller token, which the
// agent's mutating endpoints require, in a file as the client reads it.
func agentCallerToken(ctx context.Context, t *testing.T, ns, release string) nodeapi.TokenFile {
	t.Helper()
	sec, err := env.cs.CoreV1().Secrets(ns).Get(ctx, release+"-agent-caller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "caller-token")
	must(t, os.WriteFile(path, sec.Data["token"], 0o600))
	return nodeapi.TokenFile(path)
}

// waitParked waits until the application is parked (Zero, its pods
// gone, its copies on node kept).
func waitParked(ctx context.Context, t *testing.T, ns, name, app, node string) {
	t.Helper()
	eventually(t, 3*time.Minute, func() error {
		st, err := appStatus(ctx, ns, name, app)
		if err != nil {
			return err
		}
		if lc := st.Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleZero || lc.Parked == nil {
			return fmt.Errorf("lifecycle %s; want Zero, parked", lifecycleJSON(lc))
		}
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",modelorchestra.io/application=" + app + ",app.kubernetes.io/component=root"})
		if err != nil {
			return err
		}
		if len(pods.Items) != 0 {
			return fmt.Errorf("%d root pods while parked, want none", len(pods.Items))
		}
		return nil
	})
}

// dropCopies removes the node agent's hot and warm copies of name (a
// node without a copy), and checks that none is left.
func dropCopies(ctx context.Context, t *testing.T, agent nodeapi.Client, ns, name string) {
	t.Helper()
	for _, tier := range []v1alpha1.Tier{v1alpha1.TierHot, v1alpha1.TierWarm} {
		err := agent.Call(ctx, http.MethodDelete, fmt.Sprintf("%s/%s/%s/%s", nodeapi.PathTiers, tier, ns, name), nil, nil)
		if err != nil && !strings.Contains(err.Error(), ": 404") {
			t.Fatalf("removing the %s copy: %v", tier, err)
		}
		if _, ok := agentCopy(ctx, t, agent.URL, ns, name, tier); ok {
			t.Fatalf("the node agent still holds a %s copy of %s", tier, name)
		}
	}
}

// modelCacheFile is the host path of the model cache's file (the
// application's ReadWriteMany cache, a hostPath volume on this node):
// the file named base of n bytes.
func modelCacheFile(ctx context.Context, t *testing.T, ns, base string, n int64) string {
	t.Helper()
	pvcs, err := env.cs.CoreV1().PersistentVolumeClaims(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, pvc := range pvcs.Items {
		if pvc.Spec.VolumeName == "" {
			continue
		}
		pv, err := env.cs.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil || pv.Spec.HostPath == nil {
			continue
		}
		var found string
		_ = filepath.WalkDir(pv.Spec.HostPath.Path, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || d.Name() != base {
				return nil
			}
			if fi, err := d.Info(); err == nil && fi.Size() == n {
				found = p
				return fs.SkipAll
			}
			return nil
		})
		if found != "" {
			return found
		}
	}
	t.Fatalf("no %s of %d bytes in a hostPath volume of the namespace's claims", base, n)
	return ""
}

// probePeakOf reads each probe once; a probe that fails is left out.
func probePeakOf(ps []*tierprobe.Probe) ([]nodeapi.Bandwidth, error) {
	var out []nodeapi.Bandwidth
	var errs []error
	for _, p := range ps {
		b, err := p.Read()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, b)
	}
	return out, errors.Join(errs...)
}

var errZeroCopyNoContent = errors.New("the answer had no content")

// zeroCopyChat sends one streamed chat through the gateway (8 tokens,
// temperature 0, a fixed seed) and returns the time to its first
// non-empty content.
func zeroCopyChat(ctx context.Context, base, token, model, prompt string) (time.Duration, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	sent, res, err := ssetest.Post(rctx, strings.TrimSuffix(base, "/")+"/chat/completions", token, nil, map[string]any{
		"model": model, "stream": true, "max_tokens": 8, "temperature": 0, "seed": 1,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	}, nil)
	if err != nil {
		return 0, err
	}
	if res.FirstContent.IsZero() {
		return 0, errZeroCopyNoContent
	}
	return res.FirstContent.Sub(sent), nil
}

// zeroCopyPrompt finds a prompt whose answer starts with content: the
// generated model's weights are random, and at temperature 0 some prompts
// draw the end token first. The same prompt then serves every wake.
func zeroCopyPrompt(ctx context.Context, base, token, model string) (string, error) {
	var err error
	for k := range 10 {
		p := "Wake up and say something " + string(rune('a'+k))
		if _, err = zeroCopyChat(ctx, base, token, model, p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("no prompt drew content from the model: %w", err)
}

func zeroCopyTable(wakes []zeroWake, n int64, loadBefore, loadAfter string, took time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "`make bench-tiers-ollama-zero` (`go test ./internal/e2e -run TestZeroCopyBenchmark -zero-copy-bench -zero-copy-rounds %d -zero-copy-size %s`) on the real-node local cluster, %d CPUs; load average %s before, %s after; %s. ", *zeroCopyRounds, *zeroCopySize, runtime.NumCPU(), loadBefore, loadAfter, took.Round(time.Second))
	fmt.Fprintf(&b, "One parked Ollama application (the pinned build, CPU only; `minReplicas` 0, `sleepAfter` 4s, `parkAfter` 10s, the dispatcher granted patch on nodes) with a generated GGUF model of %.0f MiB in a ReadWriteMany model cache on the node's disk, woken from zero by a streamed chat through the gateway, the three cases rotating each round: with the node agent holding its verified hot copy (made when it slept, kept when it was parked); with a warm copy only (the agent's hot copy moved down to the warm tier on the node's disk, `POST /demote`, verified); and after its copies were removed through the agent's API (`DELETE /tiers/{tier}/{namespace}/{name}`), so the new pod's engine loads the model cache's file. The model cache's file and the warm copy are dropped from the page cache (`fadvise(DONTNEED)`) before every wake. ", float64(n)/(1<<20))
	b.WriteString("**First token** is the wake's chat to its first non-empty content (the pod's start, the engine's start, the load and the first token); **loaded** the same chat right after; **ready** the status's `lastWake.seconds` (first request to a ready root); **from** the status's `lastWake.fromTier`. The physical part is the model's bytes at the tier probe's rate (`internal/tierprobe`, shared with bench-tiers and bench-mux) of the very file the wake loads, read into one region kept for the run, pre-faulted in huge pages, right before and right after the wake: the hot copy with `pread` and a copy out of a populated mapping, the warm copy and the model cache's file with `pread` after dropping their pages and with `O_DIRECT`; the fastest read is the tier's limit. Medians of the wakes, with their range.\n\n")
	b.WriteString("| Wake from zero | wakes | from (status) | tier probe GB/s p50 | physical part (bytes ÷ probe) p50 | first token p50 (min–max) | ready p50 | loaded p50 |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	p50 := map[string]zeroWake{}
	for _, kind := range []string{zeroCopyWith, zeroCopyWarm, zeroCopyWithout} {
		var ws []zeroWake
		tiers := map[v1alpha1.Tier]int{}
		for _, w := range wakes {
			if w.kind == kind {
				ws = append(ws, w)
				tiers[w.fromTier]++
			}
		}
		if len(ws) == 0 {
			continue
		}
		var from []string
		for tier, c := range tiers {
			from = append(from, fmt.Sprintf("%s ×%d", cmpOr(string(tier), "?"), c))
		}
		slices.Sort(from)
		med := func(key func(zeroWake) time.Duration) zeroWake {
			s := slices.Clone(ws)
			slices.SortFunc(s, func(a, b zeroWake) int { return int(key(a) - key(b)) })
			return s[len(s)/2]
		}
		first := med(func(w zeroWake) time.Duration { return w.ttft })
		lo := slices.MinFunc(ws, func(a, b zeroWake) int { return int(a.ttft - b.ttft) })
		hi := slices.MaxFunc(ws, func(a, b zeroWake) int { return int(a.ttft - b.ttft) })
		probe := med(func(w zeroWake) time.Duration { return time.Duration(w.probe.BytesPerSecond) })
		phys := med(zeroWake.physical)
		p50[kind] = zeroWake{ttft: first.ttft, probe: phys.probe, bytes: phys.bytes}
		fmt.Fprintf(&b, "| %s | %d | %s | %.2f (%s) | %v | %v (%v–%v) | %v | %v |\n", kind, len(ws), strings.Join(from, ", "),
			probe.probe.BytesPerSecond/1e9, probe.probe.Method, phys.physical().Round(time.Millisecond),
			first.ttft.Round(time.Millisecond), lo.ttft.Round(time.Millisecond), hi.ttft.Round(time.Millisecond),
			med(func(w zeroWake) time.Duration { return w.ready }).ready, med(func(w zeroWake) time.Duration { return w.loaded }).loaded.Round(time.Millisecond))
	}
	if without, ok := p50[zeroCopyWithout]; ok {
		var parts []string
		for _, kind := range []string{zeroCopyWith, zeroCopyWarm} {
			with, ok := p50[kind]
			if !ok {
				continue
			}
			saved, physSaved := without.ttft-with.ttft, without.physical()-with.physical()
			parts = append(parts, fmt.Sprintf("with a %s copy %.2f × the wake without a copy, %v sooner, where the physical parts differ by %v",
				strings.Fields(kind)[0], float64(with.ttft)/float64(without.ttft), saved.Round(time.Millisecond), physSaved.Round(time.Millisecond)))
		}
		fmt.Fprintf(&b, "\nLike for like (p50s): %s. The physical part is a reference, not a bound: the engine does not load its file at the probe's rate (Ollama maps it and faults it in as it reads, see the table above), and each case's spread above is the noise of this comparison.\n", strings.Join(parts, "; "))
	}
	return b.String()
}

func cmpOr(s, fallback string) string {
	if s == "" {
		return fallback
	}
	return s
}
