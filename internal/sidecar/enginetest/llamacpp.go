package enginetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"
)

// LlamaCPP fakes llama-server in router mode: GET /models with
// status.value per model, POST /models/load and /models/unload with
// {"model"}, GET /props with is_sleeping, and the slot save/restore API
// (POST /slots/{id}?action=save|restore with {"filename"}). Loads complete
// after LoadDelay, as a background process start does.
type LlamaCPP struct {
	srv *httptest.Server
	// LoadDelay is how long a model stays "loading".
	LoadDelay time.Duration

	mu       sync.Mutex
	status   map[string]string
	slots    map[string]bool // saved slot files
	saved    []string
	restored []string
}

// NewLlamaCPP starts a router that knows the models, all loaded.
func NewLlamaCPP(models ...string) *LlamaCPP {
	l := &LlamaCPP{status: map[string]string{}, slots: map[string]bool{}}
	for _, m := range models {
		l.status[m] = "loaded"
	}
	l.srv = httptest.NewServer(http.HandlerFunc(l.serve))
	return l
}

// URL is the base URL.
func (l *LlamaCPP) URL() string { return l.srv.URL }

// Handler serves the fake's API, for a fake engine process that listens on
// a port of its own.
func (l *LlamaCPP) Handler() http.Handler { return http.HandlerFunc(l.serve) }

// Close stops the server.
func (l *LlamaCPP) Close() { l.srv.Close() }

// Status is the model's status.value.
func (l *LlamaCPP) Status(m string) string { l.mu.Lock(); defer l.mu.Unlock(); return l.status[m] }

// SlotCalls lists the saved and restored slot files.
func (l *LlamaCPP) SlotCalls() (saved, restored []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.saved...), append([]string(nil), l.restored...)
}

func (l *LlamaCPP) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Model    string `json:"model"`
		Filename string `json:"filename"`
	}
	if r.Method == "POST" {
		_ = json.NewDecoder(r.Body).Decode(&body)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case r.Method == "GET" && r.URL.Path == "/models":
		data := []map[string]any{}
		for m, s := range l.status {
			status := map[string]any{"value": s}
			if s != "unloaded" {
				status["args"] = []string{"llama-server", "--model", m + ".gguf"}
			}
			data = append(data, map[string]any{"id": m, "path": "/models/" + m + ".gguf", "status": status})
		}
		writeJSON(w, map[string]any{"data": data})
	case r.Method == "GET" && r.URL.Path == "/props":
		sleeping := true
		for _, s := range l.status {
			if s == "loaded" {
				sleeping = false
			}
		}
		writeJSON(w, map[string]any{"is_sleeping": sleeping})
	case r.Method == "GET" && r.URL.Path == "/metrics":
		fmt.Fprintln(w, "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0")
	case r.Method == "POST" && (r.URL.Path == "/models/load" || r.URL.Path == "/models/unload"):
		if _, ok := l.status[body.Model]; !ok {
			// llama-server answers errors in the OpenAI format
			// ({"error":{"code","message","type"}}, tools/server/README.md).
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = fmt.Fprintf(w, `{"error":{"code":404,"message":"model %s not found","type":"not_found_error"}}`, body.Model)
			return
		}
		if r.URL.Path == "/models/unload" {
			l.status[body.Model] = "unloaded"
		} else if l.status[body.Model] != "loaded" {
			l.status[body.Model] = "loading"
			m := body.Model
			time.AfterFunc(l.LoadDelay, func() {
				l.mu.Lock()
				l.status[m] = "loaded"
				l.mu.Unlock()
			})
		}
		writeJSON(w, map[string]bool{"success": true})
	case r.Method == "POST" && r.URL.Path == "/slots/0":
		if body.Filename == "" {
			http.Error(w, `{"error":{"message":"filename is required"}}`, http.StatusBadRequest)
			return
		}
		switch r.URL.Query().Get("action") {
		case "save":
			l.slots[body.Filename] = true
			l.saved = append(l.saved, body.Filename)
		case "restore":
			if !l.slots[body.Filename] {
				http.Error(w, `{"error":{"message":"file not found"}}`, http.StatusNotFound)
				return
			}
			l.restored = append(l.restored, body.Filename)
		default:
			http.Error(w, "bad action", http.StatusBadRequest)
			return
		}
		writeJSON(w, map[string]any{"id_slot": 0, "filename": body.Filename})
	default:
		http.NotFound(w, r)
	}
}
