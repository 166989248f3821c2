package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name     string
		ep       endpoint
		body     string
		want     parsedRequest // Body is checked separately
		wantBody string        // empty: the body is passed unchanged
		param    string        // non-empty: a 400 about this field
	}{{
		name: "chat",
		ep:   endpointChat, body: `{"model":"m","messages":[{"role":"user","content":"Hi"}]}`,
		want: parsedRequest{Model: "m"},
	}, {
		name: "stream asks the engine for usage",
		ep:   endpointChat, body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"Hi"}]}`,
		want:     parsedRequest{Model: "m", Stream: true},
		wantBody: `{"messages":[{"role":"user","content":"Hi"}],"model":"m","stream":true,"stream_options":{"include_usage":true}}`,
	}, {
		name: "stream keeps other stream options",
		ep:   endpointCompletions, body: `{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true}}`,
		want:     parsedRequest{Model: "m", Stream: true},
		wantBody: `{"model":"m","prompt":"x","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`,
	}, {
		name: "client asked for usage",
		ep:   endpointChat, body: `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hi"}]}`,
		want: parsedRequest{Model: "m", Stream: true, IncludeUsage: true},
	}, {
		name: "content parts and null content",
		ep:   endpointChat, body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}]}`,
		want: parsedRequest{Model: "m"},
	}, {
		name: "prompt of token arrays",
		ep:   endpointCompletions, body: `{"model":"m","prompt":[[1,2],[3]]}`,
		want: parsedRequest{Model: "m"},
	}, {
		name: "embedding of tokens",
		ep:   endpointEmbeddings, body: `{"model":"m","input":[1,2,3]}`,
		want: parsedRequest{Model: "m"},
	},
		{name: "model not a string", ep: endpointChat, body: `{"model":1,"messages":[]}`, param: "model"},
		{name: "model empty", ep: endpointChat, body: `{"model":"","messages":[]}`, param: "model"},
		{name: "model differs in case", ep: endpointChat, body: `{"MODEL":"m","messages":[{"role":"user"}]}`, param: "model"},
		{name: "stream not a boolean", ep: endpointChat, body: `{"model":"m","stream":"yes","messages":[]}`, param: "stream"},
		{name: "stream_options not an object", ep: endpointChat, body: `{"model":"m","stream":true,"stream_options":true,"messages":[]}`, param: "stream_options"},
		{name: "include_usage not a boolean", ep: endpointChat, body: `{"model":"m","stream":true,"stream_options":{"include_usage":1},"messages":[]}`, param: "stream_options.include_usage"},
		{name: "messages missing", ep: endpointChat, body: `{"model":"m"}`, param: "messages"},
		{name: "messages not an array", ep: endpointChat, body: `{"model":"m","messages":{}}`, param: "messages"},
		{name: "message not an object", ep: endpointChat, body: `{"model":"m","messages":["hi"]}`, param: "messages[0]"},
		{name: "role missing", ep: endpointChat, body: `{"model":"m","messages":[{"content":"hi"}]}`, param: "messages[0].role"},
		{name: "content a number", ep: endpointChat, body: `{"model":"m","messages":[{"role":"user","content":1}]}`, param: "messages[0].content"},
		{name: "content part without type", ep: endpointChat, body: `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, param: "messages[0].content[0]"},
		{name: "prompt an object", ep: endpointCompletions, body: `{"model":"m","prompt":{}}`, param: "prompt"},
		{name: "prompt empty array", ep: endpointCompletions, body: `{"model":"m","prompt":[]}`, param: "prompt"},
		{name: "negative token", ep: endpointCompletions, body: `{"model":"m","prompt":[-1]}`, param: "prompt[0]"},
		{name: "empty token array", ep: endpointCompletions, body: `{"model":"m","prompt":[[]]}`, param: "prompt[0]"},
		{name: "empty embedding input", ep: endpointEmbeddings, body: `{"model":"m","input":""}`, param: "input"},
		{name: "empty embedding input item", ep: endpointEmbeddings, body: `{"model":"m","input":["a",""]}`, param: "input[1]"},
		{name: "streaming embeddings", ep: endpointEmbeddings, body: `{"model":"m","input":"a","stream":true}`, param: "stream"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRequest(tt.ep, []byte(tt.body))
			if tt.param != "" {
				var ae *apiError
				if !errors.As(err, &ae) || ae.status != http.StatusBadRequest || ae.param != tt.param {
					t.Fatalf("error = %v (%+v), want a 400 about %s", err, ae, tt.param)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseRequest: %v", err)
			}
			body := string(got.Body)
			got.Body = nil
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("parsed (-want +got):\n%s", diff)
			}
			wantBody := tt.wantBody
			if wantBody == "" {
				wantBody = tt.body
			}
			if body != wantBody {
				t.Errorf("engine body = %s, want %s", body, wantBody)
			}
		})
	}
}

// FuzzParseRequest checks that the parser never panics, refuses only with
// 400s, and that an accepted body reaches the engine as valid JSON that
// means the same request. Its corpus in testdata/fuzz runs as a test.
func FuzzParseRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, epByte byte, body []byte) {
		ep := endpoint(epByte % 3)
		got, err := parseRequest(ep, body)
		if err != nil {
			var ae *apiError
			if !errors.As(err, &ae) || ae.status != http.StatusBadRequest || ae.typ != typeInvalidRequest {
				t.Fatalf("error %v is not a 400 invalid_request_error", err)
			}
			if !json.Valid(ae.body()) {
				t.Fatalf("error body is not JSON: %s", ae.body())
			}
			return
		}
		if got.Model == "" {
			t.Fatal("accepted a request without a model")
		}
		if ep == endpointEmbeddings && got.Stream {
			t.Fatal("accepted a streaming embeddings request")
		}
		if !json.Valid(got.Body) {
			t.Fatalf("engine body is not valid JSON: %q", got.Body)
		}
		if !got.Stream {
			if string(got.Body) != string(body) {
				t.Fatalf("non-streaming body changed: %q -> %q", body, got.Body)
			}
			return
		}
		// A stream's body is rewritten to ask for usage, and must mean the
		// same request otherwise.
		again, err := parseRequest(ep, got.Body)
		if err != nil {
			t.Fatalf("rewritten body refused: %v\n%q", err, got.Body)
		}
		if again.Model != got.Model || !again.Stream || !again.IncludeUsage {
			t.Fatalf("rewritten body parses as %+v, from %+v", again, got)
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil || json.Unmarshal(got.Body, &after) != nil {
			t.Fatal("bodies do not decode as objects")
		}
		for k, v := range before {
			if k == "stream_options" {
				continue
			}
			var a, b any
			if json.Unmarshal(v, &a) != nil || json.Unmarshal(after[k], &b) != nil || !cmp.Equal(a, b) {
				t.Fatalf("field %q changed: %s -> %s", k, v, after[k])
			}
		}
	})
}
