package enginetest

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"
)

// Ollama fakes Ollama's model residency API: POST /api/generate without a
// prompt loads a model (keep_alive 0 unloads it), GET /api/ps lists the
// loaded models. As in Ollama, a load is aborted when its client
// disconnects (ollama/ollama#7408).
type Ollama struct {
	srv *httptest.Server
	// LoadDelay is how long a load takes.
	LoadDelay time.Duration

	mu        sync.Mutex
	loaded    map[string]any // model -> keep_alive
	aborted   int
	loadStart chan string
}

// NewOllama starts a fake with the given models loaded.
func NewOllama(loaded ...string) *Ollama {
	o := &Ollama{loaded: map[string]any{}, loadStart: make(chan string, 16)}
	for _, m := range loaded {
		o.loaded[m] = -1
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
			// Ollama lists the model's full short name: `ollama create
			// tiny` is "tiny:latest" (server/routes.go PsHandler,
			// model.ShortName, v0.17.4).
			if i := strings.LastIndex(m, ":"); i <= strings.LastIndex(m, "/") {
				m += ":latest"
			}
			models = append(models, map[string]any{"name": m, "model": m, "size": 1 << 30, "size_vram": 0, "expires_at": "2318-01-01T00:00:00Z"})
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
