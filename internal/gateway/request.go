package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// endpoint is one of the OpenAI inference endpoints the gateway serves.
type endpoint uint8

const (
	endpointChat endpoint = iota
	endpointCompletions
	endpointEmbeddings
	// endpointResponses is POST /v1/responses, translated to the engine's
	// chat completions (responses.go).
	endpointResponses
	// endpointStoredResponses is GET and DELETE /v1/responses/{id}[/input_items].
	endpointStoredResponses
	// endpointFiles and endpointBatches are the Files and Batch APIs.
	endpointFiles
	endpointBatches
)

// path is the OpenAI (and engine) path of the endpoint; the engine path for
// the Responses API, which engines are sent as chat completions.
func (e endpoint) path() string {
	switch e {
	case endpointChat, endpointResponses:
		return "/v1/chat/completions"
	case endpointCompletions:
		return "/v1/completions"
	default:
		return "/v1/embeddings"
	}
}

// label is the endpoint's value of the endpoint metric label.
func (e endpoint) label() string {
	switch e {
	case endpointChat:
		return "chat"
	case endpointCompletions:
		return "completions"
	case endpointResponses:
		return "responses"
	case endpointStoredResponses:
		return "stored_responses"
	case endpointFiles:
		return "files"
	case endpointBatches:
		return "batches"
	default:
		return "embeddings"
	}
}

// parsedRequest is what the gateway needs to know about a request body.
type parsedRequest struct {
	// Model is the served model name.
	Model string
	// Stream is true when the client asked for server-sent events.
	Stream bool
	// MaxTokens is max_completion_tokens, else max_tokens; 0 when
	// neither is a positive integer (the engine judges the field itself).
	MaxTokens int
	// IncludeUsage is true when a streaming client asked for the usage
	// chunk (stream_options.include_usage).
	IncludeUsage bool
	// Body is the body to send to the engine: the client's body, except
	// that a streaming request always asks for usage, so that the gateway
	// can count tokens.
	Body []byte
}

// chatRoles are the message roles of the chat completions API.
var chatRoles = map[string]bool{
	"system": true, "developer": true, "user": true,
	"assistant": true, "tool": true, "function": true,
}

// parseRequest validates the parts of a request body the gateway relies on
// (model, stream, stream_options, and the shape of messages, prompt or
// input) and leaves every other field to the engine. Errors are *apiError
// with the offending field in param.
func parseRequest(ep endpoint, body []byte) (parsedRequest, error) {
	if kind(body) != '{' || !json.Valid(body) {
		return parsedRequest{}, invalidRequest("",
			"We could not parse the JSON body of your request. The body must be a JSON object "+
				"(see the OpenAI API reference for %s).", ep.path())
	}
	// The members the gateway looks at; nil when absent.
	var model, stream, streamOpts, messages, prompt, input, maxTokens, maxCompletion json.RawMessage
	eachMember(body, func(key string, val json.RawMessage) {
		switch key {
		case "max_tokens":
			maxTokens = val
		case "max_completion_tokens":
			maxCompletion = val
		case "model":
			model = val
		case "stream":
			stream = val
		case "stream_options":
			streamOpts = val
		case "messages":
			messages = val
		case "prompt":
			prompt = val
		case "input":
			input = val
		}
	})

	var req parsedRequest
	if model == nil || isNull(model) {
		return parsedRequest{}, invalidRequest("model", "You must provide a model parameter.")
	}
	if kind(model) != '"' {
		return parsedRequest{}, invalidRequest("model", "Invalid type for 'model': expected a string.")
	}
	req.Model = unquoteString(model)
	if req.Model == "" {
		return parsedRequest{}, invalidRequest("model", "You must provide a model parameter.")
	}

	if stream != nil && !isNull(stream) {
		switch string(stream) {
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
	if streamOpts != nil && !isNull(streamOpts) {
		if !req.Stream {
			return parsedRequest{}, invalidRequest("stream_options",
				"The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		if kind(streamOpts) != '{' || json.Unmarshal(streamOpts, &streamOptions) != nil {
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
		err = checkMessages(messages)
	case endpointCompletions:
		err = checkPromptLike("prompt", prompt, true)
	case endpointEmbeddings:
		err = checkPromptLike("input", input, false)
	}
	if err != nil {
		return parsedRequest{}, err
	}

	for _, raw := range []json.RawMessage{maxCompletion, maxTokens} {
		var n int
		if raw != nil && json.Unmarshal(raw, &n) == nil && n > 0 {
			req.MaxTokens = n
			break
		}
	}

	req.Body = body
	if req.Stream && !req.IncludeUsage {
		// Ask the engine for the usage chunk; the gateway counts the
		// tokens and drops the chunk before it reaches the client.
		if req.Body, err = withUsageRequested(body, streamOptions); err != nil {
			return parsedRequest{}, err
		}
	}
	return req, nil
}

// withUsageRequested returns body with stream_options.include_usage set
// to true, keeping the other stream options.
func withUsageRequested(body []byte, streamOptions map[string]json.RawMessage) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, fmt.Errorf("decoding request body: %w", err)
	}
	if streamOptions == nil {
		streamOptions = make(map[string]json.RawMessage, 1)
	}
	streamOptions["include_usage"] = json.RawMessage("true")
	so, err := json.Marshal(streamOptions)
	if err != nil {
		return nil, fmt.Errorf("encoding stream_options: %w", err)
	}
	fields["stream_options"] = so
	out, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("encoding request body: %w", err)
	}
	return out, nil
}

// checkMessages validates the messages of a chat completion request.
func checkMessages(raw json.RawMessage) error {
	if raw == nil || isNull(raw) {
		return invalidRequest("messages", "You must provide a messages parameter.")
	}
	if kind(raw) != '[' {
		return invalidRequest("messages", "Invalid type for 'messages': expected an array of objects.")
	}
	var err error
	i := 0
	eachElement(raw, func(m json.RawMessage) {
		if err != nil {
			return
		}
		err = checkMessage(i, m)
		i++
	})
	if err == nil && i == 0 {
		return invalidRequest("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.")
	}
	return err
}

// checkMessage validates messages[i].
func checkMessage(i int, m json.RawMessage) error {
	if kind(m) != '{' {
		return invalidRequest(fmt.Sprintf("messages[%d]", i),
			"Invalid type for 'messages[%d]': expected an object.", i)
	}
	var role, content json.RawMessage
	eachMember(m, func(key string, val json.RawMessage) {
		switch key {
		case "role":
			role = val
		case "content":
			content = val
		}
	})
	if role == nil || kind(role) != '"' {
		return invalidRequest(fmt.Sprintf("messages[%d].role", i),
			"Missing or invalid 'messages[%d].role': expected a string.", i)
	}
	if r := unquoteString(role); !chatRoles[r] {
		return invalidRequest(fmt.Sprintf("messages[%d].role", i),
			"Invalid value for 'messages[%d].role': %q is not one of system, developer, user, assistant, tool, function.", i, r)
	}
	if content != nil {
		return checkContent(i, content)
	}
	return nil
}

// checkContent validates a message's content: a string, null, or an array
// of content parts (objects with a string "type").
func checkContent(i int, raw json.RawMessage) error {
	param := fmt.Sprintf("messages[%d].content", i)
	switch kind(raw) {
	case '"', 'n':
		return nil
	case '[':
		var parts []json.RawMessage
		if json.Unmarshal(raw, &parts) != nil {
			break
		}
		for j, p := range parts {
			var part struct {
				Type json.RawMessage `json:"type"`
			}
			if kind(p) != '{' || json.Unmarshal(p, &part) != nil || kind(part.Type) != '"' {
				return invalidRequest(fmt.Sprintf("%s[%d]", param, j),
					"Invalid '%s[%d]': expected an object with a string 'type'.", param, j)
			}
		}
		return nil
	}
	return invalidRequest(param, "Invalid type for '%s': expected a string, an array of content parts, or null.", param)
}

// checkPromptLike validates a completions prompt or an embeddings input: a
// string, an array of strings, an array of token ids, or an array of arrays
// of token ids. allowEmptyString is false for embeddings, whose input
// strings must not be empty.
func checkPromptLike(name string, raw json.RawMessage, allowEmptyString bool) error {
	if raw == nil || isNull(raw) {
		return invalidRequest(name, "You must provide a %s parameter.", name)
	}
	invalid := func() error {
		return invalidRequest(name, "Invalid type for '%s': expected a string, an array of strings, "+
			"an array of integers, or an array of arrays of integers.", name)
	}
	switch kind(raw) {
	case '"':
		if !allowEmptyString && string(raw) == `""` {
			return invalidRequest(name, "'%s' cannot be an empty string.", name)
		}
		return nil
	case '[':
	default:
		return invalid()
	}
	var items []json.RawMessage
	if json.Unmarshal(raw, &items) != nil {
		return invalid()
	}
	if len(items) == 0 {
		return invalidRequest(name, "Invalid '%s': empty array. Expected an array with minimum length 1.", name)
	}
	first := kind(items[0])
	for i, it := range items {
		if kind(it) != first {
			return invalidRequest(name, "Invalid '%s': all items must have the same type.", name)
		}
		switch first {
		case '"':
			if !allowEmptyString && string(it) == `""` {
				return invalidRequest(fmt.Sprintf("%s[%d]", name, i), "'%s[%d]' cannot be an empty string.", name, i)
			}
		case '0':
			if !isTokenID(it) {
				return invalidRequest(fmt.Sprintf("%s[%d]", name, i), "Invalid '%s[%d]': expected a non-negative integer token id.", name, i)
			}
		case '[':
			var ids []json.RawMessage
			if json.Unmarshal(it, &ids) != nil || len(ids) == 0 {
				return invalidRequest(fmt.Sprintf("%s[%d]", name, i), "Invalid '%s[%d]': expected a non-empty array of integer token ids.", name, i)
			}
			for _, id := range ids {
				if !isTokenID(id) {
					return invalidRequest(fmt.Sprintf("%s[%d]", name, i), "Invalid '%s[%d]': expected a non-empty array of integer token ids.", name, i)
				}
			}
		default:
			return invalid()
		}
	}
	return nil
}

// kind classifies a JSON value by its first byte: '"' string, '[' array,
// '{' object, '0' number, 't' or 'f' boolean, 'n' null, 0 for nothing.
func kind(raw json.RawMessage) byte {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 {
		return 0
	}
	switch c := raw[0]; {
	case c == '-' || (c >= '0' && c <= '9'):
		return '0'
	default:
		return c
	}
}

func isNull(raw json.RawMessage) bool { return kind(raw) == 'n' }

// isTokenID reports whether raw is a non-negative integer literal.
func isTokenID(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || len(raw) > 10 {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}
