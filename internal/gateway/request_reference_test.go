package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// parseRequestReference is parseRequest as it was written first, decoding
// the body into maps; the fuzz test checks that parseRequest agrees with it.
//
// It validates the parts of a request body the gateway relies on
// (model, stream, stream_options, and the shape of messages, prompt or
// input) and leaves every other field to the engine. Errors are *apiError
// with the offending field in param.
func parseRequestReference(ep endpoint, body []byte) (parsedRequest, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return parsedRequest{}, invalidRequest("",
			"We could not parse the JSON body of your request. The body must be a JSON object "+
				"(see the OpenAI API reference for %s).", ep.path())
	}

	var req parsedRequest
	model, ok := fields["model"]
	if !ok || isNull(model) {
		return parsedRequest{}, invalidRequest("model", "You must provide a model parameter.")
	}
	if err := json.Unmarshal(model, &req.Model); err != nil || kind(model) != '"' {
		return parsedRequest{}, invalidRequest("model", "Invalid type for 'model': expected a string.")
	}
	if req.Model == "" {
		return parsedRequest{}, invalidRequest("model", "You must provide a model parameter.")
	}

	if raw, ok := fields["stream"]; ok && !isNull(raw) {
		switch string(raw) {
		case "true":
			req.Stream = true
		case "false":
		default:
			return parsedRequest{}, invalidRequest("stream", "Invalid type for 'stream': expected a boolean.")
		}
	}
	if req.Stream && ep == endpointEmbeddings {
		return parsedRequest{}, invalidRequest("stream", "Streaming is not supported for embeddings.")
	}

	var streamOptions map[string]json.RawMessage
	if raw, ok := fields["stream_options"]; ok && !isNull(raw) {
		if !req.Stream {
			return parsedRequest{}, invalidRequest("stream_options",
				"The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		if kind(raw) != '{' || json.Unmarshal(raw, &streamOptions) != nil {
			return parsedRequest{}, invalidRequest("stream_options",
				"Invalid type for 'stream_options': expected an object.")
		}
		if iu, ok := streamOptions["include_usage"]; ok && !isNull(iu) {
			switch string(iu) {
			case "true":
				req.IncludeUsage = true
			case "false":
			default:
				return parsedRequest{}, invalidRequest("stream_options.include_usage",
					"Invalid type for 'stream_options.include_usage': expected a boolean.")
			}
		}
	}

	var err error
	switch ep {
	case endpointChat:
		err = checkMessagesReference(fields["messages"])
	case endpointCompletions:
		err = checkPromptLike("prompt", fields["prompt"], true)
	case endpointEmbeddings:
		err = checkPromptLike("input", fields["input"], false)
	}
	if err != nil {
		return parsedRequest{}, err
	}

	req.Body = body
	if req.Stream && !req.IncludeUsage {
		// Ask the engine for the usage chunk; the gateway counts the
		// tokens and drops the chunk before it reaches the client.
		if streamOptions == nil {
			streamOptions = make(map[string]json.RawMessage, 1)
		}
		streamOptions["include_usage"] = json.RawMessage("true")
		so, err := json.Marshal(streamOptions)
		if err != nil {
			return parsedRequest{}, fmt.Errorf("encoding stream_options: %w", err)
		}
		fields["stream_options"] = so
		if req.Body, err = json.Marshal(fields); err != nil {
			return parsedRequest{}, fmt.Errorf("encoding request body: %w", err)
		}
	}
	return req, nil
}

// checkMessages validates the messages of a chat completion request.
func checkMessagesReference(raw json.RawMessage) error {
	if raw == nil || isNull(raw) {
		return invalidRequest("messages", "You must provide a messages parameter.")
	}
	var msgs []json.RawMessage
	if kind(raw) != '[' || json.Unmarshal(raw, &msgs) != nil {
		return invalidRequest("messages", "Invalid type for 'messages': expected an array of objects.")
	}
	if len(msgs) == 0 {
		return invalidRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.")
	}
	for i, m := range msgs {
		var msg map[string]json.RawMessage
		if kind(m) != '{' || json.Unmarshal(m, &msg) != nil {
			return invalidRequest(fmt.Sprintf("messages[%d]", i),
				"Invalid type for 'messages[%d]': expected an object.", i)
		}
		var role string
		if r, ok := msg["role"]; !ok || kind(r) != '"' || json.Unmarshal(r, &role) != nil {
			return invalidRequest(fmt.Sprintf("messages[%d].role", i),
				"Missing or invalid 'messages[%d].role': expected a string.", i)
		}
		if !chatRoles[role] {
			return invalidRequest(fmt.Sprintf("messages[%d].role", i),
				"Invalid value for 'messages[%d].role': %q is not one of system, developer, user, assistant, tool, function.", i, role)
		}
		if c, ok := msg["content"]; ok {
			if err := checkContent(i, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// FuzzParseRequestMatchesReference checks that parseRequest, which walks
// the body, decides exactly as the map-decoding parseRequestReference:
// same error (status, param, message) or same parsed request and body.
func FuzzParseRequestMatchesReference(f *testing.F) {
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"Hi"}]}`,
		` { "model" : "m" , "stream" : false , "messages" : [ { "role" : "user" , "content" : "a]}\"[{" } ] } `,
		`{"mod\u0065l":"m","messages":[{"r\u006fle":"user"}]}`,
		`{"model":"m","model":"x","messages":[{"role":"user","role":"robot"}]}`,
		`{"model":"m\u00e9","messages":[{"role":"us\"er"}]}`,
		"{\"model\":\"m\xff\",\"messages\":[{\"role\":\"\xfeuser\"}]}",
		`{"model":"m","messages":[],"messages":[{"role":"tool","content":[{"type":"text"}]}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false},"prompt":[[1,2],[3]]}`,
		`{"model":"m","input":["a",""]}`,
		`{"model":null,"messages":null}`,
		`{"model":"m","messages":[{"role":"user"},7]}`,
		`[{"model":"m"}]`,
		`{"model":"m"} trailing`,
		`null`,
		``,
	} {
		for ep := range byte(3) {
			f.Add(ep, []byte(body))
		}
	}
	f.Fuzz(func(t *testing.T, epByte byte, body []byte) {
		ep := endpoint(epByte % 3)
		got, err := parseRequest(ep, body)
		want, wantErr := parseRequestReference(ep, body)
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("%q: error %v, reference error %v", body, err, wantErr)
		}
		if err != nil {
			var ae, wae *apiError
			if !errors.As(err, &ae) || !errors.As(wantErr, &wae) {
				t.Fatalf("%q: errors %v and %v are not API errors", body, err, wantErr)
			}
			if ae.status != wae.status || ae.param != wae.param || ae.message != wae.message {
				t.Fatalf("%q: error %+v, reference %+v", body, ae, wae)
			}
			return
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("%q: parsed (-reference +got):\n%s", body, diff)
		}
	})
}

// FuzzUsageOfMatchesDecoding checks usageOf against decoding the whole
// answer.
func FuzzUsageOfMatchesDecoding(f *testing.F) {
	for _, body := range []string{
		`{"id":"x","choices":[{"message":{"content":"{\"usage\":1}"}}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
		`{"usage":{"prompt_tokens":1},"USAGE":{"prompt_tokens":2}}`,
		`{"Usage":null}`,
		`{"usage":{"prompt_tokens":"x"}}`,
		`{"u\u0073age":{"total_tokens":9}}`,
		`{"uſage":{"total_tokens":9}}`,
		`[1]`,
		`{"usage":{}} x`,
	} {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		if got, want := usageOf(body), usageOfDecoded(body); got != want {
			t.Fatalf("%q: usage %+v, decoding the whole body %+v", body, got, want)
		}
	})
}
