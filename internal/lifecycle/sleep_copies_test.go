package lifecycle_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/fetch"
	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/sidecar"
	"github.com/model-orchestra/operator/internal/sidecar/enginetest"
)

// copyLoader is an Ollama engine (enginetest's fake of its residency API)
// that, like Ollama, opens its model file at each load: the blob, here
// the sidecar's link. The model cache is <cold>/chat, with the fetcher's
// manifest.
type copyLoader struct {
	link   string
	fake   *enginetest.Ollama
	mu     sync.Mutex
	loads  []string // the file each load opened
	wrong  int      // loads whose bytes were not the model file
	weight []byte
}

const copyModel = "demo"

// handler serves the Ollama API of the fake, reading the link at each
// load, and every other request with the simulator (next).
func (l *copyLoader) handler(t *testing.T, next http.Handler, cold string, weights []byte) http.Handler {
	t.Helper()
	cache := filepath.Join(cold, "chat")
	if err := os.MkdirAll(filepath.Join(cache, ".orchestra"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cache, "weights.bin"), weights, 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(weights)
	b, _ := json.Marshal(fetch.Manifest{Version: fetch.ManifestVersion, Complete: true,
		Files: []fetch.ManifestFile{{Path: "weights.bin", Size: int64(len(weights)), SHA256: hex.EncodeToString(sum[:])}}})
	if err := os.WriteFile(fetch.ManifestPath(cache), b, 0o600); err != nil {
		t.Fatal(err)
	}
	l.weight, l.link = weights, filepath.Join(t.TempDir(), "model")
	l.fake = enginetest.NewOllama(copyModel)
	t.Cleanup(l.fake.Close)
	api := l.fake.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/") {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method == http.MethodPost && r.URL.Path == "/api/generate" {
			body, _ := io.ReadAll(r.Body)
			if !bytes.Contains(body, []byte(`"keep_alive":0`)) {
				target, _ := os.Readlink(l.link)
				data, err := os.ReadFile(l.link)
				l.mu.Lock()
				l.loads = append(l.loads, target)
				if err != nil || !bytes.Equal(data, l.weight) {
					l.wrong++
				}
				l.mu.Unlock()
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		api.ServeHTTP(w, r)
	})
}

// sidecar makes the sidecar drive the fake and point its link.
func (l *copyLoader) sidecar(s *sidecar.Config, cold, hot, warm string) {
	s.Engine.Kind, s.Engine.Model = v1alpha1.EngineOllama, copyModel
	s.Model = sidecar.ModelCopiesConfig{Link: l.link, ModelDir: filepath.Join(cold, "chat"), File: "weights.bin", HotDir: hot, WarmDir: warm, Name: "demo-chat"}
}

func (l *copyLoader) lastLoad() (string, int, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.loads) == 0 {
		return "", 0, l.wrong
	}
	return l.loads[len(l.loads)-1], len(l.loads), l.wrong
}

// TestEnginesThatUnloadWakeFromTheHottestCopy runs the leader with an
// Ollama engine that loads copies of its model file (modelCopies): as it
// falls asleep the node agent places a hot copy of the model cache's file,
// verified against the fetcher's manifest; the status says Hot, and the
// request that wakes it makes the engine open the hot copy (lastWake
// fromTier Hot with the file's bytes). After parkAfter the agent moves the
// copy to the warm tier without the engine being called, and the next wake
// opens the warm copy.
func TestEnginesThatUnloadWakeFromTheHottestCopy(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	loader := &copyLoader{}
	copies := func(s *lifecycle.SleepConfig) {
		s.ModelCopies, s.ColdPath, s.Level1Tier = true, "chat/weights.bin", v1alpha1.TierCold
	}
	p := newSleepPlane(t, planeOptions{sleep: copies, ollama: loader})
	hot, warm := filepath.Join(p.agentHot, ns, "demo-chat"), filepath.Join(p.agentWarm, ns, "demo-chat")

	asleepIn := func(tier v1alpha1.Tier) {
		t.Helper()
		eventually(t, 15*time.Second, func() error {
			if st := p.e.state(); st.State != v1alpha1.LifecycleAsleep || st.ResidentTier != tier {
				return fmt.Errorf("state %s in tier %s; want Asleep in %s", st.State, st.ResidentTier, tier)
			}
			return nil
		})
	}
	wake := func(prefix string, tier v1alpha1.Tier, path string) {
		t.Helper()
		_, before, _ := loader.lastLoad()
		if err := sendBatch(p.client, prefix, 2); err != nil {
			t.Fatalf("requests sent to the engine asleep in the %s tier were lost or failed:\n%v", tier, err)
		}
		p.lastWake(fmt.Sprintf("%d bytes from the %s tier", weightsBytes, tier), func(lw *v1alpha1.WakeStatus) bool {
			return lw.FromTier == tier && lw.Bytes == weightsBytes
		})
		if got, n, wrong := loader.lastLoad(); got != path || n != before+1 || wrong != 0 {
			t.Errorf("the engine's last load opened %s (%d loads, %d not the model file); want one more load of %s", got, n, wrong, path)
		}
	}

	stop := p.startLeader("leader-a", p.config(copies))
	asleepIn(v1alpha1.TierHot)
	if c := p.agentMetric(`orchestra_agent_promotions_total{result="ok",tier="Hot"}`); c != 1 {
		t.Errorf("orchestra_agent_promotions_total{tier=hot,result=ok} = %v; want the hot copy placed as the engine fell asleep", c)
	}
	wake("hot", v1alpha1.TierHot, hot)

	// parkAfter: the copy moves to warm; the engine is not woken for it.
	stop()
	park := func(s *lifecycle.SleepConfig) { copies(s); s.ParkAfter.Duration = 500 * time.Millisecond }
	p.startLeader("leader-b", p.config(park))
	asleepIn(v1alpha1.TierWarm)
	if _, err := os.Stat(hot); !os.IsNotExist(err) {
		t.Errorf("the hot copy is still there after the demotion: %v", err)
	}
	if _, n, _ := loader.lastLoad(); n != 1 {
		t.Errorf("the engine loaded %d times by the demotion; want it left unloaded", n-1)
	}
	wake("warm", v1alpha1.TierWarm, warm)
}

// TestEnginesLoadCopiesWithoutAReadWriteManyCache: the node agent does not
// mount the model cache (a ReadWriteOnce claim, which only the engine's
// pod mounts), so the leader's copy request names the sidecar of the
// root on the agent's node, and the agent reads the model file from it
// with the release's caller token, verified against the manifest. The
// hot copy is placed as the engine falls asleep (residentTier Hot) and the
// wake opens it; after parkAfter the copy moves to warm and the next wake
// opens the warm copy.
func TestEnginesLoadCopiesWithoutAReadWriteManyCache(t *testing.T) {
	defer lifecycle.SetRefreshEvery(50 * time.Millisecond)()
	loader := &copyLoader{}
	copies := func(s *lifecycle.SleepConfig) {
		s.ModelCopies, s.ColdPath, s.Level1Tier = true, "", v1alpha1.TierCold
	}
	p := newSleepPlane(t, planeOptions{sleep: copies, ollama: loader, cacheNotMounted: true})
	hot, warm := filepath.Join(p.agentHot, ns, "demo-chat"), filepath.Join(p.agentWarm, ns, "demo-chat")
	asleepIn := func(tier v1alpha1.Tier) {
		t.Helper()
		eventually(t, 15*time.Second, func() error {
			if st := p.e.state(); st.State != v1alpha1.LifecycleAsleep || st.ResidentTier != tier {
				return fmt.Errorf("state %s in tier %s; want Asleep in %s", st.State, st.ResidentTier, tier)
			}
			return nil
		})
	}
	wake := func(prefix string, tier v1alpha1.Tier, path string) {
		t.Helper()
		if err := sendBatch(p.client, prefix, 2); err != nil {
			t.Fatalf("requests sent to the engine asleep in the %s tier were lost or failed:\n%v", tier, err)
		}
		p.lastWake(fmt.Sprintf("%d bytes from the %s tier", weightsBytes, tier), func(lw *v1alpha1.WakeStatus) bool {
			return lw.FromTier == tier && lw.Bytes == weightsBytes
		})
		if got, _, wrong := loader.lastLoad(); got != path || wrong != 0 {
			t.Errorf("the engine's last load opened %s (%d not the model file); want %s", got, wrong, path)
		}
	}

	stop := p.startLeader("leader-a", p.config(copies))
	asleepIn(v1alpha1.TierHot)
	if c := p.agentMetric(`orchestra_agent_promotions_total{result="ok",tier="Hot"}`); c != 1 {
		t.Errorf("orchestra_agent_promotions_total{tier=hot,result=ok} = %v; want the hot copy placed through the sidecar", c)
	}
	b, err := os.ReadFile(filepath.Join(p.agentHot, ns, ".demo-chat.meta.json"))
	if err != nil || !bytes.Contains(b, []byte(`"sha256":"`)) {
		t.Errorf("the hot copy's metadata %s (%v); want the manifest's sha256 recorded", b, err)
	}
	wake("hot", v1alpha1.TierHot, hot)

	stop()
	park := func(s *lifecycle.SleepConfig) { copies(s); s.ParkAfter.Duration = 500 * time.Millisecond }
	p.startLeader("leader-b", p.config(park))
	asleepIn(v1alpha1.TierWarm)
	wake("warm", v1alpha1.TierWarm, warm)
}
