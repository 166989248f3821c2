package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/arena"
	"github.com/model-orchestra/operator/internal/sim"
)

const weightsSize = 3<<20 + 123 // not a multiple of a page or a block

// sleepy is a simulator with synthetic weights and sleep mode on.
type sleepy struct {
	t       *testing.T
	sim     *sim.Simulator
	srv     *httptest.Server
	cfg     sim.Config
	hot     string
	warm    string
	weights []byte // the expected bytes
}

func startSleepy(t *testing.T, mut func(*sim.Config), opts ...sim.Option) *sleepy {
	t.Helper()
	cfg := fastConfig()
	cfg.Weights.Bytes, cfg.Weights.Seed = weightsSize, 42
	cfg.Sleep = sim.Sleep{Enabled: true, HotDir: t.TempDir(), WarmDir: t.TempDir()}
	if mut != nil {
		mut(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	s := sim.New(cfg, opts...)
	if err := s.LoadWeights(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	want := make([]byte, weightsSize)
	arena.Synthesize(want, 42)
	return &sleepy{t: t, sim: s, srv: srv, cfg: cfg, hot: cfg.Sleep.HotDir, warm: cfg.Sleep.WarmDir, weights: want}
}

func (s *sleepy) do(method, path, body string) (int, string) {
	s.t.Helper()
	req, err := http.NewRequest(method, s.srv.URL+path, strings.NewReader(body))
	if err != nil {
		s.t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (s *sleepy) must(method, path, body string) string {
	s.t.Helper()
	code, out := s.do(method, path, body)
	if code != http.StatusOK {
		s.t.Fatalf("%s %s: %d %s", method, path, code, out)
	}
	return out
}

func (s *sleepy) chat() (int, string) {
	return s.do("POST", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`)
}

func (s *sleepy) sleeping() bool {
	var v struct {
		IsSleeping bool `json:"is_sleeping"`
	}
	if err := json.Unmarshal([]byte(s.must("GET", "/is_sleeping", "")), &v); err != nil {
		s.t.Fatal(err)
	}
	return v.IsSleeping
}

func (s *sleepy) metric(name string) string {
	s.t.Helper()
	for _, line := range strings.Split(s.must("GET", "/metrics", ""), "\n") {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			return line
		}
	}
	return ""
}

func TestSleepLevel1OffloadsToTheHotTierAndWakeVerifies(t *testing.T) {
	for _, mode := range []string{sim.DeviceMemoryPool, sim.DeviceMemoryKernel} {
		t.Run(mode, func(t *testing.T) { testSleepLevel1(t, mode) })
	}
}

func testSleepLevel1(t *testing.T, mode string) {
	s := startSleepy(t, func(c *sim.Config) { c.DeviceMemory = mode })
	if st := s.sim.WeightsStatus(); st.ResidentBytes != weightsSize || st.Digest != arena.Sum(s.weights).String() {
		t.Fatalf("after load: %+v, want %d resident bytes with the seed's digest", st, weightsSize)
	}
	if s.sleeping() {
		t.Fatal("sleeping right after start")
	}

	s.must("POST", "/sleep?level=1", "")
	hot, err := os.ReadFile(filepath.Join(s.hot, ".sim-model.weights.level1"))
	if err != nil {
		t.Fatalf("no level-1 offload copy in the hot tier: %v", err)
	}
	if !bytes.Equal(hot, s.weights) {
		t.Fatal("the hot copy is not the weights")
	}
	// The node agent reads it back as a member of its group.
	if fi, err := os.Stat(filepath.Join(s.hot, ".sim-model.weights.level1")); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o640 {
		t.Fatalf("the level-1 offload's mode %v; want 0640, readable by the hot directory's group", fi.Mode())
	}
	if st := s.sim.WeightsStatus(); st.ResidentBytes != 0 || !st.Sleeping || st.Level != 1 {
		t.Fatalf("asleep: %+v, want 0 resident bytes at level 1", st)
	}
	if got := s.metric("orchestra_sim_weights_resident_bytes"); got != "orchestra_sim_weights_resident_bytes 0" {
		t.Errorf("metric: %q", got)
	}
	if !s.sleeping() {
		t.Fatal("is_sleeping false after sleep")
	}

	code, body := s.chat()
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "asleep") {
		t.Fatalf("inference while asleep: %d %s, want 503 naming the sleep", code, body)
	}
	if got := s.metric("orchestra_sim_requests_refused_asleep_total"); got != "orchestra_sim_requests_refused_asleep_total 1" {
		t.Errorf("refused counter: %q", got)
	}

	var rep sim.StageReport
	if err := json.Unmarshal([]byte(s.must("POST", "/wake_up", "")), &rep); err != nil {
		t.Fatal(err)
	}
	// Memory returned to the kernel at sleep is faulted in again by the
	// readers; the device pool's is already there.
	if rep.Tier != v1alpha1.TierHot || !rep.Verified || rep.Bytes != weightsSize || rep.FaultedInCopy != (mode == sim.DeviceMemoryKernel) {
		t.Fatalf("wake report %+v, want a verified hot restore of %d bytes, faulted in by the readers only with device memory %q", rep, weightsSize, sim.DeviceMemoryKernel)
	}
	if s.sleeping() {
		t.Fatal("still sleeping after wake_up")
	}
	if _, err := os.Stat(filepath.Join(s.hot, ".sim-model.weights.level1")); !os.IsNotExist(err) {
		t.Errorf("the level-1 offload copy outlived the wake: %v", err)
	}
	if code, body := s.chat(); code != http.StatusOK {
		t.Fatalf("inference after wake: %d %s", code, body)
	}
	if st := s.sim.WeightsStatus(); st.ResidentBytes != weightsSize || st.Wakes != 1 || st.Verified != 1 {
		t.Fatalf("after wake: %+v", st)
	}
	if got := s.metric(`orchestra_sim_wakes_total`); got != `orchestra_sim_wakes_total{result="ok",tier="Hot"} 1` {
		t.Errorf("wakes metric: %q", got)
	}
}

func TestSleepLevel2WakesWithTheDocumentedSequence(t *testing.T) {
	s := startSleepy(t, nil)
	s.must("POST", "/sleep?level=2", "")
	if entries, _ := os.ReadDir(s.hot); len(entries) != 0 {
		t.Fatalf("level 2 wrote to the hot tier: %v", entries)
	}
	// The node agent placed a copy in the warm tier.
	if err := os.WriteFile(filepath.Join(s.warm, "sim-model.weights"), s.weights, 0o600); err != nil {
		t.Fatal(err)
	}

	s.must("POST", "/wake_up?tags=weights", "")
	if !s.sleeping() {
		t.Fatal("is_sleeping false with the KV cache still asleep")
	}
	if code, _ := s.chat(); code != http.StatusServiceUnavailable {
		t.Fatalf("inference with weights allocated but not reloaded: %d, want 503", code)
	}
	out := s.must("POST", "/collective_rpc", `{"method":"reload_weights"}`)
	if !strings.Contains(out, `"tier":"Warm"`) || !strings.Contains(out, `"verified":true`) {
		t.Fatalf("reload_weights: %s, want a verified warm restore", out)
	}
	s.must("POST", "/wake_up?tags=kv_cache", "")
	if s.sleeping() {
		t.Fatal("sleeping after the whole sequence")
	}
	if code, body := s.chat(); code != http.StatusOK {
		t.Fatalf("inference after the level-2 wake: %d %s", code, body)
	}
}

func TestLevel2WakeFallsBackToTheColdSource(t *testing.T) {
	t.Run("seed", func(t *testing.T) {
		s := startSleepy(t, nil)
		s.must("POST", "/sleep?level=2", "")
		out := s.must("POST", "/wake_up", "")
		if !strings.Contains(out, `"tier":"Cold"`) || !strings.Contains(out, `"source":"seed"`) {
			t.Fatalf("wake: %s, want a cold restore from the seed", out)
		}
	})
	t.Run("file", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "model.bin")
		want := make([]byte, 1<<20+5)
		arena.Synthesize(want, 9)
		if err := os.WriteFile(file, want, 0o600); err != nil {
			t.Fatal(err)
		}
		s := startSleepy(t, func(c *sim.Config) { c.Weights = sim.Weights{File: file} })
		if st := s.sim.WeightsStatus(); st.Bytes != int64(len(want)) || st.Digest != arena.Sum(want).String() {
			t.Fatalf("loaded %+v", st)
		}
		s.must("POST", "/sleep?level=2", "")
		out := s.must("POST", "/wake_up", "")
		if !strings.Contains(out, `"tier":"Cold"`) || !strings.Contains(out, file) || !strings.Contains(out, `"verified":true`) {
			t.Fatalf("wake: %s, want a verified cold restore from %s", out, file)
		}
	})
}

func TestCorruptTierFailsTheWakeLoudly(t *testing.T) {
	s := startSleepy(t, nil)
	s.must("POST", "/sleep?level=1", "")
	path := filepath.Join(s.hot, ".sim-model.weights.level1")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	code, body := s.do("POST", "/wake_up", "")
	if code != http.StatusInternalServerError || !strings.Contains(body, "content hash mismatch") {
		t.Fatalf("wake from a corrupt copy: %d %s, want 500 content hash mismatch", code, body)
	}
	if !s.sleeping() {
		t.Fatal("awake on corrupt weights")
	}
	if st := s.sim.WeightsStatus(); st.ResidentBytes != 0 {
		t.Fatalf("a failed wake kept %d bytes", st.ResidentBytes)
	}
	// The wake consumed the offload block by block; failing, it wrote
	// the blocks back.
	if back, err := os.ReadFile(path); err != nil || !bytes.Equal(back, b) {
		t.Fatalf("the level-1 offload is not whole after a failed wake (err %v)", err)
	}
	if code, _ := s.chat(); code != http.StatusServiceUnavailable {
		t.Fatalf("inference after a failed wake: %d", code)
	}
	if got := s.metric(`orchestra_sim_wakes_total`); got != `orchestra_sim_wakes_total{result="mismatch",tier="Hot"} 1` {
		t.Errorf("wakes metric: %q", got)
	}
}

func TestSleepIsRefusedWithRequestsInFlight(t *testing.T) {
	s := startSleepy(t, func(c *sim.Config) { c.TimeToFirstToken = time.Hour })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, "POST", s.srv.URL+"/v1/chat/completions",
			strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
		}
	}()
	eventually(t, 10*time.Second, func() error {
		if n := s.sim.WeightsStatus().InFlight; n != 1 {
			return fmt.Errorf("%d requests in flight, want the one started", n)
		}
		return nil
	})
	code, body := s.do("POST", "/sleep?level=1", "")
	if code != http.StatusConflict || !strings.Contains(body, "1 requests are running") {
		t.Fatalf("sleep with a request in flight: %d %s, want 409", code, body)
	}
	if s.sleeping() {
		t.Fatal("asleep with a request in flight")
	}
	cancel()
	<-done
	eventually(t, 10*time.Second, func() error {
		if n := s.sim.WeightsStatus().InFlight; n != 0 {
			return fmt.Errorf("%d requests in flight after the client went away, want 0", n)
		}
		return nil
	})
	s.must("POST", "/sleep?level=1", "")
}

func TestSleepFaults(t *testing.T) {
	t.Run("wake fails", func(t *testing.T) {
		s := startSleepy(t, func(c *sim.Config) { c.Faults.WakeFail = true })
		s.must("POST", "/sleep?level=1", "")
		code, body := s.do("POST", "/wake_up", "")
		if code != http.StatusInternalServerError || !strings.Contains(body, "injected wake failure") {
			t.Fatalf("wake: %d %s", code, body)
		}
		if !s.sleeping() {
			t.Fatal("awake after a failed wake")
		}
	})
	t.Run("slow wake", func(t *testing.T) {
		s := startSleepy(t, func(c *sim.Config) { c.Faults.WakeDelay = 100 * time.Millisecond })
		s.must("POST", "/sleep?level=1", "")
		start := time.Now()
		s.must("POST", "/wake_up", "")
		if d := time.Since(start); d < 100*time.Millisecond {
			t.Fatalf("wake took %v, want at least the injected 100ms", d)
		}
	})
	t.Run("memory not freed", func(t *testing.T) {
		s := startSleepy(t, func(c *sim.Config) { c.Faults.SleepLeak = true })
		s.must("POST", "/sleep?level=1", "")
		if st := s.sim.WeightsStatus(); st.ResidentBytes != weightsSize || !st.Sleeping {
			t.Fatalf("asleep with the leak: %+v, want the weights still resident", st)
		}
		s.must("POST", "/wake_up", "")
		if got := s.sim.WeightsStatus().ResidentBytes; got != 2*weightsSize {
			t.Fatalf("after a leaky cycle resident = %d, want %d", got, 2*weightsSize)
		}
		if got := s.metric("orchestra_sim_weights_resident_bytes"); got == "orchestra_sim_weights_resident_bytes 0" || got == "" {
			t.Errorf("resident metric %q does not show the leak", got)
		}
	})
}

func TestSleepEndpointsNeedSleepMode(t *testing.T) {
	srv, _ := start(t, fastConfig())
	for _, path := range []string{"/sleep?level=1", "/wake_up", "/collective_rpc"} {
		resp, err := http.Post(srv.URL+path, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s without sleep mode: %d, want 404", path, resp.StatusCode)
		}
	}
}

func TestSleepBadRequests(t *testing.T) {
	s := startSleepy(t, nil)
	for _, c := range []struct{ method, path, body, want string }{
		{"POST", "/sleep?level=3", "", "level must be 1 or 2"},
		{"POST", "/wake_up?tags=gpu", "", "unknown wake_up tag"},
		{"POST", "/collective_rpc", `{"method":"reload_weights"}`, "call POST /wake_up?tags=weights first"},
		{"POST", "/collective_rpc", `{"method":"explode"}`, "is not simulated"},
	} {
		if c.path == "/collective_rpc" && strings.Contains(c.body, "reload") {
			s.must("POST", "/sleep?level=2", "")
		}
		code, body := s.do(c.method, c.path, c.body)
		if code < 400 || !strings.Contains(body, c.want) {
			t.Errorf("%s %s: %d %s, want an error containing %q", c.method, c.path, code, body, c.want)
		}
	}
}

func TestSleepConfigValidation(t *testing.T) {
	for name, c := range map[string]struct {
		mut  func(*sim.Config)
		want string
	}{
		"bytes and file":         {func(c *sim.Config) { c.Weights = sim.Weights{Bytes: 1, File: "x"} }, "exclusive"},
		"no hot dir":             {func(c *sim.Config) { c.Weights.Bytes = 1; c.Sleep.Enabled = true }, "--hot-dir"},
		"fault needs sleep mode": {func(c *sim.Config) { c.Faults.WakeFail = true }, "--enable-sleep-mode"},
		"name with slash":        {func(c *sim.Config) { c.Weights.Name = "a/b" }, "plain file name"},
	} {
		cfg := fastConfig()
		c.mut(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

func TestLevel2WakePrefersTheAgentsHotCopyAndKeepsIt(t *testing.T) {
	s := startSleepy(t, nil)
	agentCopy := filepath.Join(s.hot, "sim-model.weights")
	if err := os.WriteFile(agentCopy, s.weights, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.warm, "sim-model.weights"), s.weights, 0o600); err != nil {
		t.Fatal(err)
	}
	// A level-1 cycle uses its own offload file and leaves the agent's copy alone.
	s.must("POST", "/sleep?level=1", "")
	s.must("POST", "/wake_up", "")
	s.must("POST", "/sleep?level=2", "")
	out := s.must("POST", "/wake_up", "")
	if !strings.Contains(out, `"tier":"Hot"`) || !strings.Contains(out, agentCopy) {
		t.Fatalf("level-2 wake: %s, want the agent's hot copy", out)
	}
	if _, err := os.Stat(agentCopy); err != nil {
		t.Fatalf("the agent's hot copy is gone: %v", err)
	}
}

// TestLevel2ReloadHoldsTheWeightsOnce: the documented level-2 sequence
// allocates the weights (wake_up?tags=weights), then fills them
// (reload_weights). The engine must end up holding them once: the arena
// the first call allocated is not left behind by the second.
func TestLevel2ReloadHoldsTheWeightsOnce(t *testing.T) {
	for _, mode := range []string{sim.DeviceMemoryPool, sim.DeviceMemoryKernel} {
		t.Run(mode, func(t *testing.T) { testLevel2ReloadOnce(t, mode) })
	}
}

func testLevel2ReloadOnce(t *testing.T, mode string) {
	const size = 64 << 20
	s := startSleepy(t, func(c *sim.Config) { c.Weights.Bytes, c.DeviceMemory = size, mode })
	s.must("POST", "/sleep?level=2", "")
	before := residentBytes(t)
	s.must("POST", "/wake_up?tags=weights", "")
	s.must("POST", "/collective_rpc", `{"method":"reload_weights"}`)
	s.must("POST", "/wake_up?tags=kv_cache", "")
	if grew := residentBytes(t) - before; grew > size*3/2 {
		t.Fatalf("the level-2 wake grew the resident memory by %d MiB for %d MiB of weights: it holds them twice", grew>>20, size>>20)
	}
}

// residentBytes is this process's resident memory (Linux).
func residentBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skipf("no /proc/self/statm: %v", err)
	}
	f := strings.Fields(string(b))
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return pages * int64(os.Getpagesize())
}

// TestTheDevicePoolKeepsTheMemoryWhileAsleep: with the device pool a sleep
// gives the weights' region back to the pool, not to the kernel (the
// engine holds 0 bytes, the device still has them), and the wake restores
// into that same region, mapping nothing new. The memory-not-freed fault
// keeps the region held, and its wake takes a second one.
func TestTheDevicePoolKeepsTheMemoryWhileAsleep(t *testing.T) {
	region := int64((weightsSize + os.Getpagesize() - 1) &^ (os.Getpagesize() - 1))
	usage := func(d *arena.Device, wantHeld, wantMapped int64) {
		t.Helper()
		if held, mapped := d.Usage(); held != wantHeld || mapped != wantMapped {
			t.Fatalf("device holds %d of %d mapped bytes, want %d of %d", held, mapped, wantHeld, wantMapped)
		}
	}
	t.Run("sleep and wake", func(t *testing.T) {
		dev := arena.NewDevice(0)
		s := startSleepy(t, nil, sim.WithDevice(dev))
		usage(dev, region, region)
		s.must("POST", "/sleep?level=1", "")
		usage(dev, 0, region)
		if st := s.sim.WeightsStatus(); st.ResidentBytes != 0 || st.DeviceMemory != sim.DeviceMemoryPool {
			t.Fatalf("asleep: %+v, want 0 resident bytes in the device pool", st)
		}
		var rep sim.StageReport
		if err := json.Unmarshal([]byte(s.must("POST", "/wake_up", "")), &rep); err != nil {
			t.Fatal(err)
		}
		if !rep.Verified || rep.FaultedInCopy {
			t.Fatalf("wake report %+v, want verified, into memory already faulted in", rep)
		}
		usage(dev, region, region)
		if code, body := s.chat(); code != http.StatusOK {
			t.Fatalf("inference after wake: %d %s", code, body)
		}
	})
	t.Run("memory not freed", func(t *testing.T) {
		dev := arena.NewDevice(0)
		s := startSleepy(t, func(c *sim.Config) { c.Faults.SleepLeak = true }, sim.WithDevice(dev))
		s.must("POST", "/sleep?level=1", "")
		usage(dev, region, region)
		if st := s.sim.WeightsStatus(); st.ResidentBytes != weightsSize {
			t.Fatalf("asleep with the fault: %+v, want the weights still resident", st)
		}
		s.must("POST", "/wake_up", "")
		usage(dev, 2*region, 2*region)
	})
	t.Run("a full device fails the wake loudly", func(t *testing.T) {
		dev := arena.NewDevice(region)
		s := startSleepy(t, func(c *sim.Config) { c.Faults.SleepLeak = true }, sim.WithDevice(dev))
		s.must("POST", "/sleep?level=1", "")
		code, body := s.do("POST", "/wake_up", "")
		if code != http.StatusInternalServerError || !strings.Contains(body, "device memory exhausted") {
			t.Fatalf("wake on a full device: %d %s, want 500 naming the exhausted device memory", code, body)
		}
		if !s.sleeping() {
			t.Fatal("awake after a failed wake")
		}
	})
}

func TestKeptOffloadIsReusedOnlyWhileUnchanged(t *testing.T) {
	s := startSleepy(t, func(c *sim.Config) { c.Sleep.KeepOffload = true })
	path := filepath.Join(s.hot, ".sim-model.weights.level1")
	sleep := func(level int) sim.StageReport {
		t.Helper()
		var rep sim.StageReport
		if err := json.Unmarshal([]byte(s.must("POST", fmt.Sprintf("/sleep?level=%d", level), "")), &rep); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	wake := func() sim.StageReport {
		t.Helper()
		var rep sim.StageReport
		if err := json.Unmarshal([]byte(s.must("POST", "/wake_up", "")), &rep); err != nil {
			t.Fatal(err)
		}
		if !rep.Verified || rep.Tier != v1alpha1.TierHot {
			t.Fatalf("wake report %+v, want a verified hot restore", rep)
		}
		return rep
	}

	if rep := sleep(1); rep.ReusedOffload {
		t.Fatalf("first sleep %+v reused an offload no wake had verified", rep)
	}
	wake()
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, s.weights) {
		t.Fatalf("the kept offload is not the weights after the wake (err %v)", err)
	}
	if rep := sleep(1); !rep.ReusedOffload || rep.CopySeconds != 0 {
		t.Fatalf("second sleep %+v, want the kept offload reused with nothing written", rep)
	}
	wake()

	// Anything that rewrites the file, even with the same bytes, makes the
	// next sleep write the weights again.
	if err := os.WriteFile(path, bytes.Repeat([]byte{0}, weightsSize), 0o600); err != nil {
		t.Fatal(err)
	}
	if rep := sleep(1); rep.ReusedOffload {
		t.Fatalf("sleep %+v reused an offload changed since the wake", rep)
	}
	if b, err := os.ReadFile(path); err != nil || !bytes.Equal(b, s.weights) {
		t.Fatalf("the sleep did not rewrite the changed offload (err %v)", err)
	}
	wake()

	// A level-2 sleep keeps nothing in RAM.
	sleep(2)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the kept offload outlived a level-2 sleep: %v", err)
	}
	if code, body := s.chat(); code != http.StatusServiceUnavailable {
		t.Fatalf("inference while asleep: %d %s", code, body)
	}
	if st := s.sim.WeightsStatus(); st.Wakes != 3 || st.Verified != 3 {
		t.Fatalf("status %+v, want 3 verified wakes", st)
	}
}
