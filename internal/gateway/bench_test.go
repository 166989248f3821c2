package gateway

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/queue"
)

// instantQueue answers every job at once with fixed chunks, so that a
// benchmark measures the gateway and not a queue.
type instantQueue struct{ unary, stream []queue.Chunk }

func (q *instantQueue) Submit(_ context.Context, job queue.Job) (queue.Reply, error) {
	if job.Stream {
		return &instantReply{chunks: q.stream}, nil
	}
	return &instantReply{chunks: q.unary}, nil
}

type instantReply struct {
	chunks []queue.Chunk
	i      int
}

func (r *instantReply) Next(context.Context) (queue.Chunk, error) {
	if r.i == len(r.chunks) {
		return queue.Chunk{}, io.EOF
	}
	r.i++
	return r.chunks[r.i-1], nil
}

func (r *instantReply) Close() error { return nil }

func newBenchGateway(b *testing.B) *Gateway {
	b.Helper()
	cfg := testConfig()
	cfg.Auth.HashKeyFile = ""
	// Limits on, as in production, but never reached.
	cfg.Limits.Default = Limits{RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 30, MaxConcurrent: 1 << 20}
	job := queue.Job{ID: "bench", Path: "/v1/chat/completions"}
	var unary []queue.Chunk
	engine := newEngine(engineOptions{})
	collect := func(job queue.Job) []queue.Chunk {
		var out []queue.Chunk
		if err := engine(context.Background(), job, func(c queue.Chunk) bool { out = append(out, c); return true }); err != nil {
			b.Fatal(err)
		}
		return out
	}
	job.Body = []byte(chatBody)
	unary = collect(job)
	job.Stream = true
	job.Body = []byte(`{"model":"llama-3-8b","stream":true,"stream_options":{"include_usage":true}}`)
	stream := collect(job)

	tokens := NewStaticTokens(NewTokenHasher([]byte("bench-hmac-key-0123456789")), map[string]*Principal{
		aliceToken: {Name: "alice", Limits: cfg.Limits.Default},
	})
	g, err := New(cfg, &instantQueue{unary: unary, stream: stream}, Options{Tokens: tokens, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkGatewayChatCompletion is the non-streaming hot path: auth,
// parse, route, limits, submit and relay, with metrics and an access log
// record, through the handler without a network.
func BenchmarkGatewayChatCompletion(b *testing.B) {
	benchmarkHandler(b, chatBody)
}

// BenchmarkGatewayChatStream is the same for a stream of seven events
// (the usage chunk is counted and dropped).
func BenchmarkGatewayChatStream(b *testing.B) {
	benchmarkHandler(b, streamBody)
}

func benchmarkHandler(b *testing.B, body string) {
	g := newBenchGateway(b)
	h := g.Handler()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				b.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
	})
}

// BenchmarkGatewayHTTP measures whole requests over loopback HTTP with
// keep-alive, from parallel clients: its ns/op is the inverse of the
// throughput on this machine (client included).
func BenchmarkGatewayHTTP(b *testing.B) {
	g := newBenchGateway(b)
	srv := httptest.NewServer(g.Handler())
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", srv.URL+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer "+aliceToken)
			resp, err := client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Fatalf("status %d", resp.StatusCode)
			}
		}
	})
}
