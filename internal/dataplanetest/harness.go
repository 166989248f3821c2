// Package dataplanetest holds the end-to-end tests of the data plane
// (gateway -> JetStream -> dispatcher -> engine), the data-plane benchmark,
// and the small harness both use: an in-process NATS server and a counted
// in-process engine simulator.
package dataplanetest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/model-orchestra/operator/internal/sim"
)

// StartNATS starts an in-process NATS server with JetStream storing in dir.
// Port -1 picks a free port; pass a former server's port to restart it.
func StartNATS(dir string, port int) (*server.Server, error) {
	opts := &server.Options{
		ServerName: "orchestra-test",
		Host:       "127.0.0.1",
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		// As the orchestra's NATS chart: a queued request of the gateway's
		// default body limit (8 MiB) fits with its headers.
		MaxPayload: 9 << 20,
		NoLog:      true,
		NoSigs:     true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("creating NATS server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("NATS server did not become ready")
	}
	return s, nil
}

// Port returns the client port of s.
func Port(s *server.Server) int { return s.Addr().(*net.TCPAddr).Port }

// Engine is an in-process simulator that counts the requests it receives
// and those still running.
type Engine struct {
	*httptest.Server
	Sim *sim.Simulator
	// Config is the simulator's configuration.
	Config sim.Config
	// Requests counts requests received; Active those not finished yet
	// (finished includes aborted by the client).
	Requests atomic.Int64
	Active   atomic.Int64
	// Hold, when set, delays every request this long before the simulator
	// sees it: nothing of the answer, not even its headers, is sent
	// before (an engine still loading its queue).
	Hold atomic.Int64 // nanoseconds
	// Refuse, while above zero, answers that many more POSTs with 503
	// (an engine briefly overloaded) before the simulator sees them.
	Refuse atomic.Int64
	// BreakOff, while above zero, answers that many more POSTs with 200,
	// the first bytes of an answer (an SSE chunk with content when the
	// request streams, a cut JSON object when not) and then a closed
	// connection (an engine that crashed mid-answer).
	BreakOff atomic.Int64
	// Seen, when set before requests arrive, is called with every POST
	// body as the engine receives it.
	Seen func(body []byte)
}

// StartEngine serves a simulator for cfg.
func StartEngine(cfg sim.Config) (*Engine, error) { return StartEngineAt(cfg, "") }

// StartEngineAt serves a simulator for cfg on addr (host:port; "" for a
// free port on the loopback), so that a replica keeps its URL from one
// run to the next, as a pod keeps its name.
func StartEngineAt(cfg sim.Config, addr string) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("simulator config: %w", err)
	}
	e := &Engine{Sim: sim.New(cfg), Config: cfg}
	h := e.Sim.Handler()
	e.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			e.Requests.Add(1)
			e.Active.Add(1)
			defer e.Active.Add(-1)
			if e.Refuse.Add(-1) >= 0 {
				http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
				return
			}
			e.Refuse.Store(0)
			if e.BreakOff.Add(-1) >= 0 {
				breakOff(w, r)
				return
			}
			e.BreakOff.Store(0)
			if e.Seen != nil {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					return
				}
				e.Seen(body)
				r.Body = io.NopCloser(bytes.NewReader(body))
			}
			if d := time.Duration(e.Hold.Load()); d > 0 {
				// Read the request first: the server notices that its
				// client went away (and ends r's context) only once the
				// body is read.
				body, err := io.ReadAll(r.Body)
				if err != nil {
					return
				}
				r.Body = io.NopCloser(bytes.NewReader(body))
				select {
				case <-r.Context().Done():
					return
				case <-time.After(d):
				}
			}
		}
		h.ServeHTTP(w, r)
	}))
	if addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, err
		}
		_ = e.Listener.Close()
		e.Listener = ln
	}
	e.Start()
	return e, nil
}

// FastSim is a simulator configuration without artificial latency.
func FastSim() sim.Config {
	cfg := sim.Default()
	cfg.TimeToFirstToken = 0
	cfg.InterTokenLatency = 0
	cfg.OutputTokens = 16
	return cfg
}

// breakOff starts an answer to r and drops the connection before its end.
func breakOff(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if bytes.Contains(body, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `data: {"id":"chatcmpl-broken","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}`+"\n\n")
	} else {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, `{"id":"chatcmpl-broken","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hel`)
	}
	w.(http.Flusher).Flush()
	conn, _, err := w.(http.Hijacker).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}
