package enginetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Ollama fakes Ollama's model residency API: POST /api/generate without a
// prompt loads a model (keep_alive 0 unloads it), GET /api/ps lists the
// loaded models, GET /api/tags the created ones. As in Ollama, a load is
// aborted when its client disconnects (ollama/ollama#7408), and a model
// that was not created answers 404 (server/routes.go GenerateHandler,
// v0.17.4: {"error":"model 'NAME' not found"}).
type Ollama struct {
	srv *httptest.Server
	// LoadDelay is how long a load takes.
	LoadDelay time.Duration

	mu        sync.Mutex
	loaded    map[string]any // model -> keep_alive
	created   map[string]bool
	aborted   int
	loadStart chan string
}

// NewOllama starts a fake with the given models loaded.
func NewOllama(loaded ...string) *Ollama {
	o := &Ollama{loaded: map[string]any{}, created: map[string]bool{}, loadStart: make(chan string, 16)}
	for _, m := range loaded {
		o.loaded[m] = -1
		o.created[m] = true
	}
	o.srv = httptest.NewServer(http.HandlerFunc(o.serve))
	return o
}

// URL is the base URL.
func (o *Ollama) URL() string { return o.srv.URL }

// Handler serves the fake's API, for a fake engine process that listens on
// a port of its own.
func (o *Ollama) Handler() http.Handler { return http.HandlerFunc(o.serve) }

// Close stops the server.
func (o *Ollama) Close() { o.srv.Close() }

// Create makes models known to the fake, as `ollama create` does, without
// loading them.
func (o *Ollama) Create(models ...string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range models {
		o.created[m] = true
	}
}

// tagged is a name as Ollama lists it: `ollama create tiny` is
// "tiny:latest" (server/routes.go PsHandler, model.ShortName, v0.17.4).
func tagged(m string) string {
	if i := strings.LastIndex(m, ":"); i <= strings.LastIndex(m, "/") {
		return m + ":latest"
	}
	return m
}

// LoadStarted receives a model name when a load begins.
func (o *Ollama) LoadStarted() <-chan string { return o.loadStart }

// Aborted counts loads aborted by a client disconnect.
func (o *Ollama) Aborted() int { o.mu.Lock(); defer o.mu.Unlock(); return o.aborted }

// KeepAlive is the keep_alive of the model's last load, or nil.
func (o *Ollama) KeepAlive(model string) any {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.loaded[model]
}

func (o *Ollama) serve(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == "GET" && r.URL.Path == "/api/ps":
		o.mu.Lock()
		models := []map[string]any{}
		for m := range o.loaded {
			m = tagged(m)
			models = append(models, map[string]any{"name": m, "model": m, "size": 1 << 30, "size_vram": 0, "expires_at": "2318-01-01T00:00:00Z"})
		}
		o.mu.Unlock()
		writeJSON(w, map[string]any{"models": models})
	case r.Method == "GET" && r.URL.Path == "/api/tags":
		o.mu.Lock()
		models := []map[string]any{}
		for m := range o.created {
			models = append(models, map[string]any{"name": tagged(m), "model": tagged(m), "size": 1 << 30})
		}
		o.mu.Unlock()
		writeJSON(w, map[string]any{"models": models})
	case r.Method == "POST" && r.URL.Path == "/api/generate":
		var req struct {
			Model     string `json:"model"`
			Prompt    string `json:"prompt"`
			KeepAlive any    `json:"keep_alive"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model == "" {
			http.Error(w, `{"error":"model is required"}`, http.StatusBadRequest)
			return
		}
		if ka, ok := req.KeepAlive.(float64); ok && ka == 0 {
			o.mu.Lock()
			delete(o.loaded, req.Model)
			o.mu.Unlock()
			writeJSON(w, map[string]any{"model": req.Model, "response": "", "done": true, "done_reason": "unload"})
			return
		}
		o.mu.Lock()
		known := false
		for m := range o.created {
			known = known || strings.EqualFold(tagged(m), tagged(req.Model))
		}
		o.mu.Unlock()
		if !known {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = fmt.Fprintf(w, `{"error":"model '%s' not found"}`, req.Model)
			return
		}
		o.loadStart <- req.Model
		select {
		case <-time.After(o.LoadDelay):
		case <-r.Context().Done():
			o.mu.Lock()
			o.aborted++
			o.mu.Unlock()
			return
		}
		o.mu.Lock()
		o.loaded[req.Model] = req.KeepAlive
		o.mu.Unlock()
		writeJSON(w, map[string]any{"model": req.Model, "response": "", "done": true, "done_reason": "load"})
	default:
		http.NotFound(w, r)
	}
}
