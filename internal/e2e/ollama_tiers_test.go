package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// TestOllamaWakesFromAVerifiedHotCopy runs the real Ollama engine as a
// sleeping application whose model cache the node agent reads
// (ReadWriteMany): the sidecar points Ollama's blob at the hottest
// verified copy of the GGUF on its node. Idle, Ollama unloads the model
// and the leader asks the node agent for a hot copy, which the agent
// verifies against the fetcher's manifest sha256: the status says Hot, and
// the chat that wakes it loads the copy in RAM (lastWake.fromTier Hot, the
// GGUF's bytes). A byte of that copy then flips on the node: the agent's
// verification drops it, the status says Cold, and the next wake loads
// the model cache, answered as before. With parkAfter the hot copy moves
// to the warm tier, and the wake after it loads the disk copy. Ollama and
// its sidecar run as uid 65532, reading the copies as members of their
// group (global.agent.copyGroup).
func TestOllamaWakesFromAVerifiedHotCopy(t *testing.T) {
	requireOllama(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-ollama-tiers")
	const name, app = "tiers", "ollama"
	logf := stepLogf(t)
	o := deployOllamaTiers(ctx, t, ns, name, app, nil, logf)
	token, base, served, sha, size, copyName, root, agentURL := o.token, o.base, o.served, o.sha, o.size, o.copyName, o.root, o.agentURL
	sec, err := env.cs.CoreV1().Secrets(ns).Get(ctx, name+"-agent-caller", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	callerToken := string(sec.Data["token"])

	if st, err := sidecarState(ctx, ns, root.Name); err != nil || st.Model == nil || st.Model.Tier != v1alpha1.TierCold || st.Model.Path != "/models/"+stack.DemoFile {
		t.Fatalf("at start the sidecar pointed Ollama at %+v (%v); want the model cache's %s (no copy on the node yet)", st, err, stack.DemoFile)
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, "hello", 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat: %v", err)
	}

	// asleepIn waits until the application sleeps with its model file
	// resting in tier, as the status and the sidecar say. It fails t, the
	// subtest that calls it.
	asleepIn := func(t *testing.T, tier v1alpha1.Tier, path string) {
		t.Helper()
		eventually(t, 90*time.Second, func() error {
			st, err := appStatus(ctx, ns, name, app)
			if err != nil {
				return err
			}
			if lc := st.Lifecycle; lc == nil || lc.State != v1alpha1.LifecycleAsleep || lc.ResidentTier != tier {
				return fmt.Errorf("lifecycle %s; want Asleep with residentTier %s", lifecycleJSON(st.Lifecycle), tier)
			}
			sc, err := sidecarState(ctx, ns, root.Name)
			if err != nil {
				return err
			}
			if sc.State != sidecarapi.Asleep || sc.Model == nil || sc.Model.Path != path || sc.Model.Bytes != size {
				return fmt.Errorf("sidecar %s, next wake loads %+v; want Asleep, loading %s (%d bytes)", sc.State, sc.Model, path, size)
			}
			if loaded, err := ollamaLoaded(ctx, root); err != nil || len(loaded) != 0 {
				return fmt.Errorf("asleep, Ollama still has %q loaded (%v)", loaded, err) //nolint:errorlint // err may be nil: what the poll saw
			}
			return nil
		})
		logf("asleep, the model file in the %s tier", tier)
	}
	// wakeFrom sends a chat and checks that the wake loaded tier. It fails
	// t, the subtest that calls it.
	wakeFrom := func(t *testing.T, tier v1alpha1.Tier, path string) {
		t.Helper()
		st, _ := appStatus(ctx, ns, name, app)
		wakes := st.Lifecycle.Wakes
		sent := time.Now()
		res, err := stack.StreamChat(ctx, base, token, served, "wake up", 8, nil)
		if err != nil || !res.Answered() {
			t.Fatalf("the chat sent to the sleeping engine: %+v, %v", res, err)
		}
		logf("the chat that woke Ollama from the %s tier was answered in %s", tier, time.Since(sent).Round(time.Millisecond))
		eventually(t, 30*time.Second, func() error {
			st, err := appStatus(ctx, ns, name, app)
			if err != nil {
				return err
			}
			lc := st.Lifecycle
			if lc == nil || lc.State != v1alpha1.LifecycleAwake || lc.Wakes != wakes+1 || lc.LastWake == nil {
				return fmt.Errorf("lifecycle %s; want Awake after wake %d", lifecycleJSON(lc), wakes+1)
			}
			if lc.LastWake.FromTier != tier || lc.LastWake.Bytes != size {
				return fmt.Errorf("lastWake %s; want fromTier %s with the GGUF's %d bytes", jsonOf(lc.LastWake), tier, size)
			}
			return nil
		})
		sc, err := sidecarState(ctx, ns, root.Name)
		if err != nil {
			t.Fatal(err)
		}
		if sc.Model == nil || sc.Model.Path != path || sc.LastWake == nil || sc.LastWake.Transfer == nil || sc.LastWake.Transfer.Tier != tier || !sc.LastWake.Transfer.Verified {
			t.Errorf("the sidecar says the engine loaded %+v, its last wake %s; want %s, verified", sc.Model, jsonOf(sc.LastWake), path)
		}
		if loaded, err := ollamaLoaded(ctx, root); err != nil || len(loaded) != 1 {
			t.Errorf("awake, Ollama has %q loaded (%v); want the model", loaded, err)
		}
	}

	hotPath := "/var/run/model-orchestra/hot/" + copyName
	t.Run("asleep, the node agent holds a verified hot copy and the wake loads it", func(t *testing.T) {
		asleepIn(t, v1alpha1.TierHot, hotPath)
		e, ok := agentCopy(ctx, t, agentURL, ns, copyName, v1alpha1.TierHot)
		if !ok || e.SHA256 != sha || e.Bytes != size {
			t.Fatalf("the node agent's hot copy %+v (%v); want %d bytes verified against the manifest's sha256 %s", e, ok, size, sha)
		}
		wakeFrom(t, v1alpha1.TierHot, hotPath)
		// It loaded the copy as non-root: the engine and the sidecar read
		// the agent's copies as members of their group.
		wantCopyReadersNonRoot(t, root, filepath.Join(tierDirs(t)[0], ns, copyName))
	})

	t.Run("a hot copy that no longer verifies is dropped and never loaded", func(t *testing.T) {
		asleepIn(t, v1alpha1.TierHot, hotPath)
		// The copy on the node (the hot tier's hostPath), as a bad RAM
		// page or a stray writer would leave it.
		onNode := filepath.Join(tierDirs(t)[0], ns, copyName)
		f, err := os.OpenFile(onNode, os.O_RDWR, 0)
		if err != nil {
			t.Fatalf("the hot copy on the node: %v", err)
		}
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, size/2); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0xff
		if _, err := f.WriteAt(b, size/2); err != nil {
			t.Fatal(err)
		}
		_ = f.Close()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentURL+nodeapi.PathVerify, nil)
		if err != nil {
			t.Fatal(err)
		}
		nodeapi.Authorize(req, callerToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("POST /verify: %d %s", resp.StatusCode, body)
		}
		var verified []nodeapi.Verification
		if err := json.Unmarshal(body, &verified); err != nil || !slices.ContainsFunc(verified, func(v nodeapi.Verification) bool {
			return v.Namespace == ns && v.Name == copyName && v.Tier == v1alpha1.TierHot && v.Dropped
		}) {
			t.Fatalf("POST /verify answered %s (%v); want the hot copy that no longer matches its digest dropped", body, err)
		}
		// The corrupted copy is gone. The next wake loads the model cache,
		// unless a leader placed a new hot copy from the cache meanwhile
		// (a leader that takes the sleeping engine over asks for it, as
		// falling asleep does): then that fresh copy, verified against the
		// manifest's sha256. Either way the corrupted bytes are never
		// loaded.
		tier, path := v1alpha1.TierCold, "/models/"+stack.DemoFile
		if e, ok := agentCopy(ctx, t, agentURL, ns, copyName, v1alpha1.TierHot); ok {
			if e.SHA256 != sha || e.Bytes != size || !e.VerifiedAt.After(time.Now().Add(-2*time.Minute)) {
				t.Fatalf("after the drop the node agent lists the hot copy %+v; want none, or a new one verified against the manifest", e)
			}
			tier, path = v1alpha1.TierHot, hotPath
			logf("a new hot copy was placed from the model cache after the drop")
		}
		asleepIn(t, tier, path)
		wakeFrom(t, tier, path)
	})

	t.Run("after parkAfter the copy moves to the warm tier and the wake loads it", func(t *testing.T) {
		obj := ollamaTiersResource(t, ns, name, app, map[string]any{"parkAfter": "4s"})
		if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
			t.Fatal(err)
		}
		warmPath := "/var/run/model-orchestra/warm/" + copyName
		asleepIn(t, v1alpha1.TierWarm, warmPath)
		if _, ok := agentCopy(ctx, t, agentURL, ns, copyName, v1alpha1.TierHot); ok {
			t.Error("the hot copy stayed after the demotion")
		}
		if e, ok := agentCopy(ctx, t, agentURL, ns, copyName, v1alpha1.TierWarm); !ok || e.SHA256 != sha {
			t.Fatalf("the warm copy %+v (%v); want the manifest's sha256 carried from the hot copy", e, ok)
		}
		wakeFrom(t, v1alpha1.TierWarm, warmPath)
		if p, err := env.cs.CoreV1().Pods(ns).Get(ctx, root.Name, metav1.GetOptions{}); err != nil || p.UID != root.UID {
			t.Errorf("the root pod was replaced (%v)", err)
		} else {
			for _, s := range p.Status.ContainerStatuses {
				if s.RestartCount > 0 {
					t.Errorf("container %s restarted %d times", s.Name, s.RestartCount)
				}
			}
		}
	})
}

// ollamaTiers is a sleeping Ollama application (ollamaTiersResource),
// Ready, and what its tests read.
type ollamaTiers struct {
	token, base, served string // the API token, the gateway's base URL, the served model
	sha                 string // the GGUF's sha256, hex
	size                int64  // the GGUF's bytes
	copyName            string // the ModelCheckpoint's name: the copies' name
	root                *corev1.Pod
	agentURL            string // the node agent on the root's node
}

// deployOllamaTiers applies ollamaTiersResource(lifecycle) in ns, waits
// for it to be Ready and reads what its tests need. It sends no chat.
func deployOllamaTiers(ctx context.Context, t *testing.T, ns, name, app string, lifecycle map[string]any, logf func(string, ...any)) ollamaTiers {
	t.Helper()
	return deployOllamaTiersObject(ctx, t, ns, name, app, ollamaTiersResource(t, ns, name, app, lifecycle), logf)
}

// deployOllamaTiersObject is deployOllamaTiers of obj, an
// ollamaTiersResource changed by the caller.
func deployOllamaTiersObject(ctx context.Context, t *testing.T, ns, name, app string, obj *unstructured.Unstructured, logf func(string, ...any)) ollamaTiers {
	t.Helper()
	o := ollamaTiers{token: apiToken(ctx, t, ns), served: ollamaServed(app), copyName: name + "-" + app}
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	logf("Ready")
	var err error
	if o.base, err = stack.GatewayURL(ctx, env.cs, ns, name); err != nil {
		t.Fatal(err)
	}
	gguf := stack.TinyModelFiles()[stack.DemoFile]
	sum := sha256.Sum256(gguf)
	o.sha, o.size = hex.EncodeToString(sum[:]), int64(len(gguf))
	o.root = appRoot(ctx, t, ns, name, app)
	o.agentURL = nodeAgentURL(ctx, t, ns, name, o.root.Spec.NodeName)
	return o
}

// ollamaTiersResource is one sleeping Ollama application on the mirrored
// model with a ReadWriteMany cache, which the node agent mounts.
func ollamaTiersResource(t *testing.T, ns, name, app string, lifecycle map[string]any) *unstructured.Unstructured {
	t.Helper()
	obj := ollamaResource(t, ns, name)
	spec, _, _ := unstructured.NestedMap(obj.Object, "spec", "applications", ollamaSleepy)
	lc := map[string]any{"minReplicas": int64(1), "maxReplicas": int64(1), "sleepAfter": "4s", "maxWait": "2m"}
	for k, v := range lifecycle {
		lc[k] = v
	}
	spec["lifecycle"] = lc
	spec["serving"].(map[string]any)["servedModelName"] = ollamaServed(app)
	spec["model"].(map[string]any)["cache"] = map[string]any{"size": "1Gi", "accessMode": "ReadWriteMany"}
	must(t, unstructured.SetNestedMap(obj.Object, map[string]any{app: spec}, "spec", "applications"))
	return obj
}

// nodeAgentURL is the base URL of the release's node agent on node.
func nodeAgentURL(ctx context.Context, t *testing.T, ns, release, node string) string {
	t.Helper()
	var url string
	eventually(t, time.Minute, func() error {
		pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release + ",app.kubernetes.io/component=checkpoint-agent"})
		if err != nil {
			return err
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName == node && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
				url = "http://" + net.JoinHostPort(p.Status.PodIP, "9301")
				return nil
			}
		}
		return fmt.Errorf("no running node agent on %s", node)
	})
	return url
}

// agentCopy is the node agent's copy of name in tier, if it holds one.
func agentCopy(ctx context.Context, t *testing.T, agentURL, ns, name string, tier v1alpha1.Tier) (nodeapi.Entry, bool) {
	t.Helper()
	var st nodeapi.TiersStatus
	if err := (nodeapi.Client{URL: agentURL, HTTP: http.DefaultClient}).Call(ctx, http.MethodGet, nodeapi.PathTiers, nil, &st); err != nil {
		t.Fatalf("GET /tiers of the node agent: %v", err)
	}
	for _, e := range st.Entries {
		if e.Namespace == ns && e.Name == name && e.Tier == tier && !e.Offload {
			return e, true
		}
	}
	return nodeapi.Entry{}, false
}
