package dataplanetest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/model-orchestra/operator/internal/batch"
	"github.com/model-orchestra/operator/internal/dataplanetest"
	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
)

// batchInput is a batch input file of n chat lines req-0 .. req-<n-1>,
// each answered in maxTokens tokens.
func batchInput(model string, n, maxTokens int) []byte {
	var b bytes.Buffer
	for i := range n {
		fmt.Fprintf(&b, `{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":"line %d"}]}}`+"\n",
			i, model, maxTokens, i)
	}
	return b.Bytes()
}

func uploadBatchFile(t *testing.T, ctx context.Context, c openai.Client, data []byte) *openai.FileObject {
	t.Helper()
	f, err := c.Files.New(ctx, openai.FileNewParams{File: openai.File(bytes.NewReader(data), "input.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func newBatch(t *testing.T, ctx context.Context, c openai.Client, fileID string) *openai.Batch {
	t.Helper()
	b, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: fileID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h, Metadata: map[string]string{"job": "nightly"}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// waitBatch waits until the batch has status want, failing on another
// terminal status.
func waitBatch(t *testing.T, ctx context.Context, c openai.Client, id string, want openai.BatchStatus, within time.Duration) *openai.Batch {
	t.Helper()
	var b *openai.Batch
	eventually(t, within, func() error {
		var err error
		if b, err = c.Batches.Get(ctx, id); err != nil {
			return err
		}
		if b.Status != want && batch.Terminal(string(b.Status)) {
			t.Fatalf("batch %s ended %s, want %s (counts %+v)", id, b.Status, want, b.RequestCounts)
		}
		if b.Status != want {
			return fmt.Errorf("batch is %s (counts %+v)", b.Status, b.RequestCounts)
		}
		return nil
	})
	return b
}

// readLines returns a result file's lines by custom_id, failing on a
// custom_id seen twice; order lists the custom_ids as they came.
func readLines(t *testing.T, ctx context.Context, c openai.Client, fileID string) (map[string]batch.OutputLine, []string) {
	t.Helper()
	if fileID == "" {
		return map[string]batch.OutputLine{}, nil
	}
	res, err := c.Files.Content(ctx, fileID)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]batch.OutputLine{}
	var order []string
	for line := range bytes.Lines(data) {
		var l batch.OutputLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("result line %q: %v", line, err)
		}
		if _, dup := out[l.CustomID]; dup {
			t.Errorf("custom_id %s appears twice in file %s", l.CustomID, fileID)
		}
		out[l.CustomID] = l
		order = append(order, l.CustomID)
	}
	return out, order
}

// checkComplete asserts a completed batch of n lines: exact counts, and one
// successful answer per custom_id in line order.
func checkComplete(t *testing.T, ctx context.Context, c openai.Client, b *openai.Batch, n int) {
	t.Helper()
	if b.RequestCounts.Total != int64(n) || b.RequestCounts.Completed != int64(n) || b.RequestCounts.Failed != 0 {
		t.Errorf("request counts %+v, want %d completed of %d", b.RequestCounts, n, n)
	}
	out, order := readLines(t, ctx, c, b.OutputFileID)
	if len(out) != n {
		t.Errorf("output file has %d distinct custom_ids, want %d (0 lost, 0 duplicated)", len(out), n)
	}
	for i := range n {
		id := fmt.Sprintf("req-%d", i)
		l, ok := out[id]
		switch {
		case !ok:
			t.Errorf("%s has no result", id)
		case l.Response == nil || l.Response.StatusCode != 200 || l.Error != nil:
			t.Errorf("%s: response %+v, error %+v", id, l.Response, l.Error)
		case i < len(order) && order[i] != id:
			t.Errorf("output line %d is %s, want %s (line order)", i, order[i], id)
		default:
			var cc openai.ChatCompletion
			if err := json.Unmarshal(l.Response.Body, &cc); err != nil || len(cc.Choices) == 0 || cc.Choices[0].Message.Content == "" {
				t.Errorf("%s: body %s is not a chat completion with content", id, l.Response.Body)
			}
		}
	}
	if b.ErrorFileID != "" {
		errs, _ := readLines(t, ctx, c, b.ErrorFileID)
		t.Errorf("error file has %d lines, want none", len(errs))
	}
}

// TestBatchCompletesLineForLine runs a batch through the data plane with
// the official SDK: exact counts, one answer per line in line order, the
// timestamps, list and retrieve, and nothing visible to another token.
func TestBatchCompletesLineForLine(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	simCfg := dataplanetest.FastSim()
	s := startStack(t, simCfg, nil)
	dispatcher(t, s)
	c := clientFor(s.Gateway.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const n = 40
	f := uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 8))
	if f.Purpose != "batch" || f.Bytes != int64(len(batchInput(simCfg.Model, n, 8))) || f.Filename != "input.jsonl" {
		t.Errorf("file object %+v", f)
	}
	b := newBatch(t, ctx, c, f.ID)
	if b.Status != "validating" || b.RequestCounts.Total != n || b.Metadata["job"] != "nightly" || b.ExpiresAt != b.CreatedAt+24*3600 {
		t.Errorf("new batch: %+v", b)
	}
	b = waitBatch(t, ctx, c, b.ID, openai.BatchStatusCompleted, 30*time.Second)
	if b.InProgressAt == 0 || b.FinalizingAt == 0 || b.CompletedAt == 0 || b.CompletedAt < b.InProgressAt {
		t.Errorf("timestamps: in_progress %d finalizing %d completed %d", b.InProgressAt, b.FinalizingAt, b.CompletedAt)
	}
	checkComplete(t, ctx, c, b, n)

	page, err := c.Batches.List(ctx, openai.BatchListParams{Limit: openai.Int(10)})
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != b.ID {
		t.Errorf("list batches: %v, %+v", err, page)
	}
	files, err := c.Files.List(ctx, openai.FileListParams{})
	if err != nil || len(files.Data) != 2 {
		t.Errorf("list files: %v, %d files (want the input and the output)", err, len(files.Data))
	}

	other := openai.NewClient(option.WithBaseURL(s.Gateway.URL+"/v1"), option.WithAPIKey(dataplanetest.OtherAPIKey), option.WithMaxRetries(0))
	var apiErr *openai.Error
	for name, call := range map[string]func() error{
		"retrieve batch": func() error { _, err := other.Batches.Get(ctx, b.ID); return err },
		"cancel batch":   func() error { _, err := other.Batches.Cancel(ctx, b.ID); return err },
		"retrieve file":  func() error { _, err := other.Files.Get(ctx, f.ID); return err },
		"file content": func() error {
			res, err := other.Files.Content(ctx, b.OutputFileID)
			if res != nil {
				_ = res.Body.Close()
			}
			return err
		},
		"delete file": func() error { _, err := other.Files.Delete(ctx, f.ID); return err },
		"batch on file": func() error {
			_, err := other.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
				CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
			return err
		},
	} {
		if err := call(); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
			t.Errorf("another token's %s = %v, want 404", name, err)
		}
	}
	if l, err := other.Batches.List(ctx, openai.BatchListParams{}); err != nil || len(l.Data) != 0 {
		t.Errorf("another token lists %v batches (%v), want none", l, err)
	}

	if _, err := c.Files.Delete(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Files.Get(ctx, f.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("a deleted file = %v, want 404", err)
	}
}

// upload posts a multipart upload and returns the status and the error
// message.
func upload(t *testing.T, url, purpose string, data []byte) (int, string) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	if purpose != "" {
		_ = mw.WriteField("purpose", purpose)
	}
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = fw.Write(data)
	_ = mw.Close()
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/files", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+dataplanetest.APIKey)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = res.Body.Close() }()
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.NewDecoder(res.Body).Decode(&e)
	return res.StatusCode, e.Error.Message
}

// TestBatchRefusesMalformedInput: every malformed upload and batch gets a
// 400 (413 for size) naming the line and the problem.
func TestBatchRefusesMalformedInput(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	simCfg := dataplanetest.FastSim()
	s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
		c.Gateway = func(g *gateway.Config) { g.Batch.MaxFileBytes = 4096 }
	})
	good := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}}`
	for _, tc := range []struct {
		name, purpose, data string
		status              int
		want                string
	}{
		{"empty", "batch", "", 400, "empty"},
		{"not json", "batch", good + "\n{oops\n", 400, "Line 2 of the file: The line is not a JSON object"},
		{"blank line", "batch", good + "\n\n" + strings.Replace(good, `"a"`, `"b"`, 1), 400, "Line 2 of the file: The line is empty"},
		{"duplicate", "batch", good + "\n" + good, 400, `Line 2 of the file: custom_id "a" is already used on line 1`},
		{"no custom_id", "batch", strings.Replace(good, `"custom_id":"a",`, "", 1), 400, "Line 1 of the file: custom_id is missing"},
		{"method", "batch", strings.Replace(good, "POST", "GET", 1), 400, `Line 1 of the file: method is "GET"`},
		{"url", "batch", strings.Replace(good, "/v1/chat/completions", "/v1/images", 1), 400, `Line 1 of the file: url "/v1/images" is not supported`},
		{"no model", "batch", strings.Replace(good, `"model":"sim-model",`, "", 1), 400, "Line 1 of the file: body.model must name the model"},
		{"stream", "batch", strings.Replace(good, `"model"`, `"stream":true,"model"`, 1), 400, "Line 1 of the file: body.stream is true"},
		{"bad messages", "batch", strings.Replace(good, `"role":"user"`, `"role":"robot"`, 1), 400, "Line 1 of the file: body:"},
		{"purpose", "fine-tune", good, 400, `Invalid 'purpose': "fine-tune"`},
		{"no purpose", "", good, 400, "'purpose' field is missing"},
		{"too large", "batch", strings.Repeat(good+"\n", 40), 413, "larger than 4096 bytes"},
	} {
		status, msg := upload(t, s.Gateway.URL, tc.purpose, []byte(tc.data))
		if status != tc.status || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %d %q, want %d containing %q", tc.name, status, msg, tc.status, tc.want)
		}
	}

	c := clientFor(s.Gateway.URL)
	ctx := context.Background()
	unknown := strings.Replace(good, "sim-model", "no-such-model", 1)
	for _, tc := range []struct {
		name   string
		data   string
		window string
		status int
		want   string
	}{
		{"window", good, "1h", 400, "completion_window"},
		{"unknown model", unknown, "24h", 404, "no-such-model"},
	} {
		f := uploadBatchFile(t, ctx, c, []byte(tc.data))
		_, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
			CompletionWindow: openai.BatchNewParamsCompletionWindow(tc.window)})
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status || !strings.Contains(apiErr.Message, tc.want) {
			t.Errorf("%s: %v, want %d containing %q", tc.name, err, tc.status, tc.want)
		}
	}
	var apiErr *openai.Error
	if _, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: "file-nope", Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h}); !errors.As(err, &apiErr) || apiErr.StatusCode != 404 {
		t.Errorf("a batch on a missing file: %v, want 404", err)
	}
	f := uploadBatchFile(t, ctx, c, []byte(good))
	if _, err := c.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1Completions,
		CompletionWindow: openai.BatchNewParamsCompletionWindow24h}); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 ||
		!strings.Contains(apiErr.Message, `Line 1 of the file: url "/v1/chat/completions" differs from the batch's endpoint`) {
		t.Errorf("a batch whose lines use another endpoint: %v", err)
	}
}

// TestBatchCancel: a batch whose lines wait (no dispatcher) is cancelled:
// cancelling, then cancelled with every line in the error file, and none
// of its lines reaches the engine afterwards.
func TestBatchCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	simCfg := dataplanetest.FastSim()
	s := startStack(t, simCfg, nil)
	if err := dispatcherStop(t, s); err != nil { // provisions the streams
		t.Fatal(err)
	}
	c := clientFor(s.Gateway.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 12
	b := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 4)).ID)
	waitBatch(t, ctx, c, b.ID, openai.BatchStatusInProgress, 10*time.Second)
	got, err := c.Batches.Cancel(ctx, b.ID)
	if err != nil || (got.Status != "cancelling" && got.Status != "cancelled") || got.CancellingAt == 0 {
		t.Fatalf("cancel: %v %+v", err, got)
	}
	b = waitBatch(t, ctx, c, b.ID, openai.BatchStatusCancelled, 10*time.Second)
	if b.CancelledAt == 0 || b.RequestCounts.Total != n || b.RequestCounts.Completed != 0 || b.RequestCounts.Failed != n {
		t.Errorf("cancelled batch: %+v", b)
	}
	errs, _ := readLines(t, ctx, c, b.ErrorFileID)
	for i := range n {
		if l := errs[fmt.Sprintf("req-%d", i)]; l.Error == nil || l.Error.Code != batch.CodeCancelled {
			t.Errorf("req-%d: %+v, want error %s", i, l, batch.CodeCancelled)
		}
	}
	var apiErr *openai.Error
	if _, err := c.Batches.Cancel(ctx, b.ID); !errors.As(err, &apiErr) || apiErr.StatusCode != 409 {
		t.Errorf("cancelling a cancelled batch: %v, want 409", err)
	}
	dispatcher(t, s)
	time.Sleep(time.Second) // a dispatcher that found lines would have sent them by now
	if r := s.Engine.Requests.Load(); r != 0 {
		t.Errorf("the engine received %d requests of a cancelled batch", r)
	}
}

// TestBatchExpires: lines that did not run within the completion window
// are expired; the batch ends expired with exact counts.
func TestBatchExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	var skew atomic.Int64
	simCfg := dataplanetest.FastSim()
	s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
		c.BatchNow = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	})
	d := dispatcher(t, s)
	c := clientFor(s.Gateway.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A first batch completes, so that the second's expiry is not the only
	// path tested.
	first := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, 3, 4)).ID)
	waitBatch(t, ctx, c, first.ID, openai.BatchStatusCompleted, 20*time.Second)
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}
	const n = 8
	b := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 4)).ID)
	waitBatch(t, ctx, c, b.ID, openai.BatchStatusInProgress, 10*time.Second)
	skew.Store(int64(25 * time.Hour))
	b = waitBatch(t, ctx, c, b.ID, openai.BatchStatusExpired, 10*time.Second)
	if b.ExpiredAt == 0 || b.RequestCounts.Failed != n || b.RequestCounts.Completed != 0 || b.OutputFileID != "" {
		t.Errorf("expired batch: %+v", b)
	}
	errs, _ := readLines(t, ctx, c, b.ErrorFileID)
	if len(errs) != n {
		t.Errorf("error file has %d lines, want %d", len(errs), n)
	}
	for id, l := range errs {
		if l.Error == nil || l.Error.Code != batch.CodeExpired || l.Response != nil {
			t.Errorf("%s: %+v, want error %s", id, l, batch.CodeExpired)
		}
	}
}

// TestBatchWaitsForInteractiveRequests: while interactive requests use the
// application's whole concurrency no batch line reaches the engine, and an
// interactive request that arrives while a batch waits goes first; the
// batch runs in the capacity left.
func TestBatchWaitsForInteractiveRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the in-process data plane")
	}
	simCfg := dataplanetest.FastSim()
	simCfg.OutputTokens = 60
	simCfg.InterTokenLatency = 10 * time.Millisecond
	const slots = 2
	s := startStack(t, simCfg, func(c *dataplanetest.StackConfig) {
		c.Dispatcher = func(d *dispatch.Config) { d.Apps[0].MaxConcurrency = slots }
	})
	var mu sync.Mutex
	var order []string // what the engine received: "interactive" or "batch"
	s.Engine.Seen = func(body []byte) {
		kind := "interactive"
		if bytes.Contains(body, []byte(`"content":"line `)) {
			kind = "batch"
		}
		mu.Lock()
		order = append(order, kind)
		mu.Unlock()
	}
	dispatcher(t, s)
	c := clientFor(s.Gateway.URL)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	done := make(chan error, slots+1)
	ask := func() {
		_, err := c.Chat.Completions.New(ctx, chat("a long interactive answer")) // 60 tokens, 0.6 s
		done <- err
	}
	for range slots {
		go ask()
	}
	eventually(t, 5*time.Second, holds("the interactive requests to run", func() bool { return s.Engine.Active.Load() == slots }))
	const n = 6
	b := newBatch(t, ctx, c, uploadBatchFile(t, ctx, c, batchInput(simCfg.Model, n, 2)).ID)
	waitBatch(t, ctx, c, b.ID, openai.BatchStatusInProgress, 5*time.Second)
	time.Sleep(100 * time.Millisecond) // the batch's lines wait to be moved
	go ask()                           // arrives after the batch, while every slot is busy
	for range slots + 1 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	b = waitBatch(t, ctx, c, b.ID, openai.BatchStatusCompleted, 30*time.Second)
	checkComplete(t, ctx, c, b, n)
	mu.Lock()
	defer mu.Unlock()
	want := []string{"interactive", "interactive", "interactive"}
	if len(order) != slots+1+n || !slices.Equal(order[:slots+1], want) {
		t.Errorf("the engine received %v: want the %d interactive requests first, then the %d batch lines", order, slots+1, n)
	}
}
