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
