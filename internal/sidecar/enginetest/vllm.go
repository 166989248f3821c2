// Package enginetest has fake inference engines that mimic the sleep and
// unload APIs of vLLM, Ollama and llama.cpp, including their documented
// failure modes, for contract tests of the checkpoint agent's adapters.
package enginetest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// VLLM fakes vLLM's dev-mode sleep API (VLLM_SERVER_DEV_MODE=1 and
// --enable-sleep-mode) with its failure modes:
//   - a request sent while asleep crashes the engine (vllm-project/vllm#15483);
//   - /sleep with requests in flight answers 200 and then the engine is dead
//     (vllm-project/vllm#45520);
//   - after level 2, waking without collective_rpc reload_weights serves
//     garbage weights.
//
// Once crashed, every request's connection is dropped.
//
// The requests, as vLLM's sleep-mode documentation (docs/features/
// sleep_mode.md, "Online Serving") gives them:
//
//	curl -X POST 'http://localhost:8000/sleep?level=1'
//	curl -X POST 'http://localhost:8000/wake_up'
//
//	curl -X POST 'http://localhost:8000/sleep?level=2'
//	# Reallocate weights memory only
//	curl -X POST 'http://localhost:8000/wake_up?tags=weights'
//	# Load weights in-place
//	curl -X POST 'http://localhost:8000/collective_rpc' -H 'Content-Type: application/json' -d '{"method":"reload_weights"}'
//	# Reallocate KV cache
//	curl -X POST 'http://localhost:8000/wake_up?tags=kv_cache'
//
// and "GET /is_sleeping — Check if the model is sleeping" ({"is_sleeping":
// bool}, true "until all sleeping memory tags are restored"). Level 1
// backs the weights up in CPU memory; level 2 discards them, and
// reload_weights loads them in place from the model path vLLM was started
// with (the model runner's model_loader.load_weights(model,
// model_config=...), model_config.model being --model). With SetModel the
// fake reads that path at each reload_weights: every *.safetensors file
// of the directory (following a symlink, as Python's open does), and
// fails the call as vLLM would when it cannot.
type VLLM struct {
	srv *httptest.Server

	mu           sync.Mutex
	level        int
	weightsAwake bool
	kvAwake      bool
	weightsValid bool
	inFlight     int
	crashed      string
	calls        []string
	model        string   // the --model path reload_weights reads ("": not read)
	reloads      []Reload // what each reload_weights read
}

// Reload is one reload_weights: the directory the model path resolved to
// and the bytes of the safetensors files read from it.
type Reload struct {
	Dir   string
	Bytes int64
}

// SetModel makes reload_weights read the model directory at path.
func (v *VLLM) SetModel(path string) { v.mu.Lock(); v.model = path; v.mu.Unlock() }

// Reloads lists what each reload_weights read.
func (v *VLLM) Reloads() []Reload {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]Reload(nil), v.reloads...)
}

// readModel reads the safetensors files of the model directory at path,
// resolved.
func readModel(path string) (Reload, error) {
	dir, err := filepath.EvalSymlinks(path)
	if err != nil {
		return Reload{}, err
	}
	shards, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return Reload{}, fmt.Errorf("listing the *.safetensors in %s: %w", dir, err)
	}
	if len(shards) == 0 {
		return Reload{}, fmt.Errorf("no *.safetensors in %s", dir)
	}
	r := Reload{Dir: dir}
	for _, s := range shards {
		b, err := os.ReadFile(s)
		if err != nil {
			return Reload{}, err
		}
		r.Bytes += int64(len(b))
	}
	return r, nil
}

// ModelName is the model the fake vLLM serves (GET /v1/models).
const ModelName = "m"

// NewVLLM starts an awake fake vLLM.
func NewVLLM() *VLLM {
	v := &VLLM{weightsAwake: true, kvAwake: true, weightsValid: true}
	v.srv = httptest.NewServer(http.HandlerFunc(v.serve))
	return v
}

// URL is the base URL.
func (v *VLLM) URL() string { return v.srv.URL }

// Handler serves the fake's API, for a fake engine process that listens on
// a port of its own.
func (v *VLLM) Handler() http.Handler { return http.HandlerFunc(v.serve) }

// Close stops the server.
func (v *VLLM) Close() { v.srv.Close() }

// SetInFlight sets vllm:num_requests_running.
func (v *VLLM) SetInFlight(n int) { v.mu.Lock(); v.inFlight = n; v.mu.Unlock() }

// Crashed returns why the engine died, or "".
func (v *VLLM) Crashed() string { v.mu.Lock(); defer v.mu.Unlock(); return v.crashed }

// WeightsValid is false while the engine would compute with garbage.
func (v *VLLM) WeightsValid() bool { v.mu.Lock(); defer v.mu.Unlock(); return v.weightsValid }

// Calls lists "METHOD path?query" of every call, in order.
func (v *VLLM) Calls() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.calls...)
}

func (v *VLLM) serve(w http.ResponseWriter, r *http.Request) {
	v.mu.Lock()
	defer v.mu.Unlock()
	call := r.Method + " " + r.URL.Path
	if r.URL.RawQuery != "" {
		call += "?" + r.URL.RawQuery
	}
	v.calls = append(v.calls, call)
	if v.crashed != "" {
		panic(http.ErrAbortHandler)
	}
	asleep := !v.weightsAwake || !v.kvAwake
	switch {
	case r.Method == "GET" && r.URL.Path == "/metrics":
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} 0\n", v.inFlight)
	case r.Method == "GET" && r.URL.Path == "/is_sleeping":
		writeJSON(w, map[string]bool{"is_sleeping": asleep})
	case r.Method == "POST" && r.URL.Path == "/sleep":
		level := r.URL.Query().Get("level")
		if level != "1" && level != "2" {
			http.Error(w, "bad level", http.StatusBadRequest)
			return
		}
		if v.inFlight > 0 {
			v.crashed = "slept with requests in flight (vllm#45520)"
			w.WriteHeader(http.StatusOK) // the engine dies after answering
			return
		}
		v.level = int(level[0] - '0')
		v.weightsAwake, v.kvAwake = false, false
		v.weightsValid = v.level == 1
		w.WriteHeader(http.StatusOK)
	case r.Method == "POST" && r.URL.Path == "/wake_up":
		tags := r.URL.Query()["tags"]
		if len(tags) == 0 || contains(tags, "weights") {
			v.weightsAwake = true
		}
		if len(tags) == 0 || contains(tags, "kv_cache") {
			v.kvAwake = true
		}
		w.WriteHeader(http.StatusOK)
	case r.Method == "POST" && r.URL.Path == "/collective_rpc":
		var req struct {
			Method string `json:"method"`
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &req)
		if req.Method != "reload_weights" {
			http.Error(w, "unknown method", http.StatusBadRequest)
			return
		}
		if !v.weightsAwake {
			http.Error(w, "weights are asleep", http.StatusInternalServerError)
			return
		}
		if v.model != "" {
			r, err := readModel(v.model)
			if err != nil {
				http.Error(w, `{"error":{"message":"reload_weights: `+strings.ReplaceAll(err.Error(), `"`, `'`)+`"}}`, http.StatusInternalServerError)
				return
			}
			v.reloads = append(v.reloads, r)
		}
		v.weightsValid = true
		writeJSON(w, map[string]any{"results": []any{nil}})
	case r.Method == "GET" && r.URL.Path == "/v1/models":
		// ModelList of ModelCard (vllm/entrypoints/openai/protocol.py):
		// answered asleep too, as vLLM's sleep-mode docs say.
		writeJSON(w, map[string]any{"object": "list", "data": []any{map[string]any{
			"id": ModelName, "object": "model", "created": 1764000000, "owned_by": "vllm",
			"root": ModelName, "parent": nil, "max_model_len": 4096,
			"permission": []any{map[string]any{"id": "modelperm-0", "object": "model_permission", "created": 1764000000,
				"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
				"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false}},
		}}})
	case r.Method == "POST" && r.URL.Path == "/reset_prefix_cache":
		w.WriteHeader(http.StatusOK)
	case r.Method == "POST" && strings.HasPrefix(r.URL.Path, "/v1/"):
		if asleep {
			v.crashed = "request while asleep (vllm#15483)"
			panic(http.ErrAbortHandler)
		}
		writeJSON(w, map[string]any{"choices": []any{map[string]any{"text": "ok", "garbage": !v.weightsValid}}})
	default:
		http.NotFound(w, r)
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		for _, p := range strings.Split(v, ",") {
			if p == s {
				return true
			}
		}
	}
	return false
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
