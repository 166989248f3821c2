package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/model-orchestra/operator/internal/queue"
)

// engineFunc plays the engine behind the fake queue: it answers job by
// sending chunks until it returns. A non-nil error ends the reply with it.
type engineFunc func(ctx context.Context, job queue.Job, send func(queue.Chunk) bool) error

// fakeQueue is an in-memory queue.Queue that runs each job on an engine in
// a goroutine.
type fakeQueue struct {
	engine    engineFunc
	submitErr error

	mu      sync.Mutex
	jobs    []queue.Job
	replies []*fakeReply
}

func (q *fakeQueue) Submit(ctx context.Context, job queue.Job) (queue.Reply, error) {
	if q.submitErr != nil {
		return nil, q.submitErr
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	engineCtx, cancel := context.WithCancel(context.Background())
	r := &fakeReply{ch: make(chan queue.Chunk), done: make(chan struct{}), cancel: cancel, engineCtx: engineCtx}
	q.mu.Lock()
	q.jobs = append(q.jobs, job)
	q.replies = append(q.replies, r)
	q.mu.Unlock()
	go func() {
		send := func(c queue.Chunk) bool {
			select {
			case r.ch <- c:
				return true
			case <-engineCtx.Done():
				return false
			}
		}
		r.err = q.engine(engineCtx, job, send)
		close(r.done)
	}()
	return r, nil
}

func (q *fakeQueue) lastJob(t *testing.T) queue.Job {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.jobs) == 0 {
		t.Fatal("no job was submitted")
	}
	return q.jobs[len(q.jobs)-1]
}

func (q *fakeQueue) lastReply(t *testing.T) *fakeReply {
	t.Helper()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.replies) == 0 {
		t.Fatal("no job was submitted")
	}
	return q.replies[len(q.replies)-1]
}

func (q *fakeQueue) submitted() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}

// fakeReply is the answer to one job of a fakeQueue.
type fakeReply struct {
	ch        chan queue.Chunk
	done      chan struct{} // closed when the engine returned
	err       error         // the engine's result, set before done closes
	cancel    context.CancelFunc
	engineCtx context.Context
	complete  atomic.Bool // Next returned io.EOF
	closed    atomic.Bool
}

func (r *fakeReply) Next(ctx context.Context) (queue.Chunk, error) {
	select {
	case c := <-r.ch:
		return c, nil
	case <-r.done:
		// The engine may have sent its last chunk just before returning.
		select {
		case c := <-r.ch:
			return c, nil
		default:
		}
		if r.err != nil {
			return queue.Chunk{}, r.err
		}
		r.complete.Store(true)
		return queue.Chunk{}, io.EOF
	case <-ctx.Done():
		return queue.Chunk{}, ctx.Err()
	}
}

func (r *fakeReply) Close() error {
	r.closed.Store(true)
	r.cancel()
	return nil
}

// engineOptions adjust the fake engine's behaviour.
type engineOptions struct {
	// chunkSize cuts the body into chunks of this many bytes (0: one
	// chunk per event, or one chunk for a JSON body).
	chunkSize int
	// hold, when set, is waited for after the first event of a stream.
	hold <-chan struct{}
	// failAfter, when set, ends a stream with this error after the first
	// content event.
	failAfter error
}

// chatWords is what the fake engine answers to every chat request.
var chatWords = []string{"Hello", " from", " the", " engine"}

const (
	fakePromptTokens     = 7
	fakeCompletionTokens = 4
	fakeCreated          = 1700000000
)

// newEngine returns an OpenAI-like engine: deterministic answers with usage,
// SSE streams that end with [DONE], and the usage chunk when asked for.
func newEngine(o engineOptions) engineFunc {
	return func(ctx context.Context, job queue.Job, send func(queue.Chunk) bool) error {
		var req struct {
			Model         string `json:"model"`
			StreamOptions *struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		if err := json.Unmarshal(job.Body, &req); err != nil {
			return fmt.Errorf("engine got invalid JSON: %w", err)
		}
		head := queue.Chunk{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}}
		usage := fmt.Sprintf(`{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}`,
			fakePromptTokens, fakePromptTokens+fakeCompletionTokens, fakeCompletionTokens)
		text := strings.Join(chatWords, "")

		if !job.Stream {
			var body string
			switch job.Path {
			case "/v1/chat/completions":
				body = fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion","created":%d,"model":%q,`+
					`"choices":[{"index":0,"message":{"role":"assistant","content":%q},"finish_reason":"stop"}],"usage":%s}`,
					job.ID, fakeCreated, req.Model, text, usage)
			case "/v1/completions":
				body = fmt.Sprintf(`{"id":"cmpl-%s","object":"text_completion","created":%d,"model":%q,`+
					`"choices":[{"index":0,"text":%q,"finish_reason":"stop","logprobs":null}],"usage":%s}`,
					job.ID, fakeCreated, req.Model, text, usage)
			case "/v1/embeddings":
				body = fmt.Sprintf(`{"object":"list","model":%q,"data":[{"object":"embedding","index":0,`+
					`"embedding":[0.25,-0.5,1]}],"usage":{"prompt_tokens":%d,"total_tokens":%d}}`,
					req.Model, fakePromptTokens, fakePromptTokens)
			default:
				return fmt.Errorf("engine got unexpected path %q", job.Path)
			}
			return sendCut(head, []string{body}, o.chunkSize, send)
		}

		head.Header = http.Header{"Content-Type": {"text/event-stream"}}
		events := streamEvents(job, req.Model, req.StreamOptions != nil && req.StreamOptions.IncludeUsage, usage)
		if o.hold != nil || o.failAfter != nil {
			if !send(queue.Chunk{Status: head.Status, Header: head.Header, Data: []byte(events[0] + events[1])}) {
				return ctx.Err()
			}
			if o.failAfter != nil {
				return o.failAfter
			}
			select {
			case <-o.hold:
			case <-ctx.Done():
				return ctx.Err()
			}
			return sendCut(queue.Chunk{}, events[2:], o.chunkSize, send)
		}
		return sendCut(head, events, o.chunkSize, send)
	}
}

// streamEvents are the SSE events of a streamed answer to job.
func streamEvents(job queue.Job, model string, includeUsage bool, usage string) []string {
	var events []string
	chat := job.Path == "/v1/chat/completions"
	prefix := fmt.Sprintf(`{"id":"cmpl-%s","object":"text_completion","created":%d,"model":%q,"choices":[`, job.ID, fakeCreated, model)
	if chat {
		prefix = fmt.Sprintf(`{"id":"chatcmpl-%s","object":"chat.completion.chunk","created":%d,"model":%q,"choices":[`, job.ID, fakeCreated, model)
		events = append(events, "data: "+prefix+`{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n")
	}
	for _, w := range chatWords {
		if chat {
			events = append(events, fmt.Sprintf("data: %s{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", prefix, w))
		} else {
			events = append(events, fmt.Sprintf("data: %s{\"index\":0,\"text\":%q,\"finish_reason\":null}]}\n\n", prefix, w))
		}
	}
	if chat {
		events = append(events, "data: "+prefix+`{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n")
	} else {
		events = append(events, "data: "+prefix+`{"index":0,"text":"","finish_reason":"stop"}]}`+"\n\n")
	}
	if includeUsage {
		events = append(events, "data: "+prefix+`],"usage":`+usage+"}\n\n")
	}
	return append(events, "data: [DONE]\n\n")
}

// sendCut sends parts as chunks: one per part, or cut every size bytes
// across part boundaries. head's Status and Header go on the first chunk.
func sendCut(head queue.Chunk, parts []string, size int, send func(queue.Chunk) bool) error {
	var chunks [][]byte
	if size <= 0 {
		for _, p := range parts {
			chunks = append(chunks, []byte(p))
		}
	} else {
		all := []byte(strings.Join(parts, ""))
		for len(all) > 0 {
			n := min(size, len(all))
			chunks = append(chunks, all[:n])
			all = all[n:]
		}
	}
	for i, c := range chunks {
		ch := queue.Chunk{Data: c}
		if i == 0 {
			ch.Status, ch.Header = head.Status, head.Header
		}
		if !send(ch) {
			return context.Canceled
		}
	}
	return nil
}

// eventually polls cond until it holds or the timeout passes.
