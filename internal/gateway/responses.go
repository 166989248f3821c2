package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The Responses API (POST /v1/responses) is served for every engine by
// translating it to the engine's chat completions: the request becomes a
// chat request (instructions a system message, input items messages, a
// previous response's conversation in front), the answer a response
// object, and a stream the Responses event sequence. This file holds the
// translation; responses_http.go the handlers.

// respItem is a message item of a response's input or output.
type respItem struct {
	ID      string     `json:"id,omitempty"`
	Type    string     `json:"type"`
	Status  string     `json:"status,omitempty"`
	Role    string     `json:"role"`
	Content []respPart `json:"content"`
}

// respPart is a text part of a message item.
type respPart struct {
	Type        string           `json:"type"`
	Text        string           `json:"text"`
	Annotations *json.RawMessage `json:"annotations,omitempty"`
	Logprobs    *json.RawMessage `json:"logprobs,omitempty"`
}

var emptyArray = json.RawMessage(`[]`)

// outputPart is the output_text part of an answer.
func outputPart(text string) respPart {
	return respPart{Type: "output_text", Text: text, Annotations: &emptyArray, Logprobs: &emptyArray}
}

// text is the item's text, its parts joined.
func (it respItem) text() string {
	var b strings.Builder
	for _, p := range it.Content {
		b.WriteString(p.Text)
	}
	return b.String()
}

// respUsage is the Responses API usage.
type respUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

func responsesUsage(u usage) *respUsage {
	return &respUsage{
		InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens,
		InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": 0},
	}
}

// responseObject is the Responses API response object.
type responseObject struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	Error              json.RawMessage `json:"error"`
	IncompleteDetails  json.RawMessage `json:"incomplete_details"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Model              string          `json:"model"`
	Output             []respItem      `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID *string         `json:"previous_response_id"`
	Store              bool            `json:"store"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Text               json.RawMessage `json:"text"`
	ToolChoice         string          `json:"tool_choice"`
	Tools              []any           `json:"tools"`
	Truncation         string          `json:"truncation"`
	Usage              *respUsage      `json:"usage"`
	User               *string         `json:"user,omitempty"`
	Metadata           json.RawMessage `json:"metadata"`
}

// storedResponse is what the store keeps of a response: the object and
// the conversation that led to it (instructions excluded: they do not
// carry over to a continuation, as in OpenAI's API).
type storedResponse struct {
	Response responseObject `json:"response"`
	Input    []respItem     `json:"input"`
}

// responsesRequest is a parsed POST /v1/responses body.
type responsesRequest struct {
	Model           string
	Stream          bool
	Store           bool
	Instructions    *string
	Input           []respItem // this request's input items
	PreviousID      string
	MaxOutputTokens *int
	Temperature     *float64
	TopP            *float64
	User            *string
	Metadata        json.RawMessage
	Text            json.RawMessage
	responseFormat  json.RawMessage // chat response_format, from text.format
}

// responsesFields are the request fields the gateway knows: it serves
// the ones with true, and refuses the others (when set to anything but
// their neutral value) with a 400 naming them; any other field is
// refused as unrecognized, as OpenAI does.
var responsesFields = map[string]bool{
	"model": true, "input": true, "instructions": true, "previous_response_id": true,
	"stream": true, "store": true, "max_output_tokens": true, "temperature": true, "top_p": true,
	"user": true, "metadata": true, "text": true, "tools": true, "tool_choice": true,
	"parallel_tool_calls": true, "truncation": true, "service_tier": true, "stream_options": true,
	"safety_identifier": true, "prompt_cache_key": true,
	"background": false, "include": false, "reasoning": false, "conversation": false,
	"prompt": false, "top_logprobs": false, "max_tool_calls": false,
}

// parseResponsesRequest validates a Responses API body. Errors are
// *apiError naming the field in param.
func parseResponsesRequest(body []byte) (*responsesRequest, error) {
	var m map[string]json.RawMessage
	if kind(body) != '{' || json.Unmarshal(body, &m) != nil {
		return nil, invalidRequest("", "We could not parse the JSON body of your request. The body must be a JSON object "+
			"(see the OpenAI API reference for /v1/responses).")
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := m[k]
		served, known := responsesFields[k]
		switch {
		case !known:
			return nil, invalidRequest(k, "Unrecognized request argument supplied: %s", k)
		case !served && !neutral(v):
			return nil, invalidRequest(k, "The '%s' parameter is not supported by this gateway, which serves the Responses API "+
				"by translating it to the model's chat completions.", k)
		}
	}
	r := &responsesRequest{Store: true}
	var err error
	if r.Model, err = stringField(m, "model", true); err != nil {
		return nil, err
	}
	if r.Model == "" {
		return nil, invalidRequest("model", "You must provide a model parameter.")
	}
	if r.Stream, err = boolField(m, "stream", false); err != nil {
		return nil, err
	}
	if r.Store, err = boolField(m, "store", true); err != nil {
		return nil, err
	}
	if v, ok := m["stream_options"]; ok && !isNull(v) && !r.Stream {
		return nil, invalidRequest("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	if v, ok := m["instructions"]; ok && !isNull(v) {
		s, err := stringField(m, "instructions", false)
		if err != nil {
			return nil, err
		}
		r.Instructions = &s
	}
	if r.PreviousID, err = stringField(m, "previous_response_id", false); err != nil {
		return nil, err
	}
	if v, ok := m["user"]; ok && !isNull(v) {
		s, err := stringField(m, "user", false)
		if err != nil {
			return nil, err
		}
		r.User = &s
	}
	if v, ok := m["max_output_tokens"]; ok && !isNull(v) {
		var n int
		if json.Unmarshal(v, &n) != nil || n < 1 {
			return nil, invalidRequest("max_output_tokens", "Invalid 'max_output_tokens': expected an integer of at least 1.")
		}
		r.MaxOutputTokens = &n
	}
	for name, dst := range map[string]**float64{"temperature": &r.Temperature, "top_p": &r.TopP} {
		if v, ok := m[name]; ok && !isNull(v) {
			var f float64
			if json.Unmarshal(v, &f) != nil {
				return nil, invalidRequest(name, "Invalid type for '%s': expected a number.", name)
			}
			*dst = &f
		}
	}
	if v, ok := m["metadata"]; ok && !isNull(v) {
		if kind(v) != '{' {
			return nil, invalidRequest("metadata", "Invalid type for 'metadata': expected an object.")
		}
		r.Metadata = v
	}
	if err := r.parseTools(m); err != nil {
		return nil, err
	}
	if err := r.parseText(m["text"]); err != nil {
		return nil, err
	}
	if v, ok := m["truncation"]; ok && !isNull(v) && string(v) != `"disabled"` {
		return nil, invalidRequest("truncation", "Invalid value for 'truncation': only \"disabled\" is supported by this gateway.")
	}
	in, ok := m["input"]
	if !ok || isNull(in) {
		return nil, invalidRequest("input", "You must provide an input parameter.")
	}
	if r.Input, err = parseInput(in); err != nil {
		return nil, err
	}
	return r, nil
}

// neutral reports whether v leaves an unsupported field without effect:
// null, false, an empty array or an empty object.
func neutral(v json.RawMessage) bool {
	switch string(bytes.Join(bytes.Fields(v), nil)) {
	case "null", "false", "[]", "{}":
		return true
	}
	return false
}

func stringField(m map[string]json.RawMessage, name string, required bool) (string, error) {
	v, ok := m[name]
	if !ok || isNull(v) {
		if required {
			return "", invalidRequest(name, "You must provide a %s parameter.", name)
		}
		return "", nil
	}
	var s string
	if kind(v) != '"' || json.Unmarshal(v, &s) != nil {
		return "", invalidRequest(name, "Invalid type for '%s': expected a string.", name)
	}
	return s, nil
}

func boolField(m map[string]json.RawMessage, name string, def bool) (bool, error) {
	v, ok := m[name]
	if !ok || isNull(v) {
		return def, nil
	}
	switch string(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, invalidRequest(name, "Invalid type for '%s': expected a boolean.", name)
}

// parseTools refuses tools: built-in tools cannot run behind an engine's
// chat completions, and function tools are not translated yet.
func (r *responsesRequest) parseTools(m map[string]json.RawMessage) error {
	v, ok := m["tools"]
	if !ok || neutral(v) {
		if tc, ok := m["tool_choice"]; ok && !isNull(tc) && string(tc) != `"none"` && string(tc) != `"auto"` {
			return invalidRequest("tool_choice", "Invalid 'tool_choice': the request has no tools.")
		}
		return nil
	}
	var tools []struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(v, &tools) != nil {
		return invalidRequest("tools", "Invalid type for 'tools': expected an array of tool objects.")
	}
	if len(tools) == 0 {
		return nil
	}
	// The first tool is the one reported: none is supported.
	if tools[0].Type == "function" {
		return invalidRequest("tools[0]", "Function tools are not supported by this gateway's Responses API yet; "+
			"use /v1/chat/completions with tools.")
	}
	return invalidRequest("tools[0].type", "The built-in tool '%s' is not supported by this gateway: "+
		"it serves the Responses API by translating it to the model's chat completions, which run no tools.", tools[0].Type)
}

// parseText reads text.format into the chat response_format.
func (r *responsesRequest) parseText(v json.RawMessage) error {
	r.Text = json.RawMessage(`{"format":{"type":"text"}}`)
	if v == nil || isNull(v) {
		return nil
	}
	var t struct {
		Format *struct {
			Type        string          `json:"type"`
			Name        string          `json:"name"`
			Schema      json.RawMessage `json:"schema"`
			Description string          `json:"description"`
			Strict      *bool           `json:"strict"`
		} `json:"format"`
		Verbosity json.RawMessage `json:"verbosity"`
	}
	if json.Unmarshal(v, &t) != nil {
		return invalidRequest("text", "Invalid type for 'text': expected an object.")
	}
	if t.Verbosity != nil && !isNull(t.Verbosity) {
		return invalidRequest("text.verbosity", "The 'text.verbosity' parameter is not supported by this gateway.")
	}
	if t.Format == nil {
		return nil
	}
	r.Text = v
	switch t.Format.Type {
	case "text":
	case "json_object":
		r.responseFormat = json.RawMessage(`{"type":"json_object"}`)
	case "json_schema":
		if t.Format.Name == "" || t.Format.Schema == nil {
			return invalidRequest("text.format", "Invalid 'text.format': a json_schema format needs a name and a schema.")
		}
		js := map[string]any{"name": t.Format.Name, "schema": t.Format.Schema}
		if t.Format.Description != "" {
			js["description"] = t.Format.Description
		}
		if t.Format.Strict != nil {
			js["strict"] = *t.Format.Strict
		}
		b, _ := json.Marshal(map[string]any{"type": "json_schema", "json_schema": js})
		r.responseFormat = b
	default:
		return invalidRequest("text.format.type", "Invalid value for 'text.format.type': expected text, json_object or json_schema.")
	}
	return nil
}

// inputRoles are the roles of input message items.
var inputRoles = map[string]bool{"user": true, "system": true, "developer": true, "assistant": true}

// parseInput reads input: a string (one user message) or an array of
// message items whose content is a string or text parts.
func parseInput(v json.RawMessage) ([]respItem, error) {
	if kind(v) == '"' {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return nil, invalidRequest("input", "Invalid type for 'input': expected a string or an array of input items.")
		}
		return []respItem{{Type: "message", Role: "user", Content: []respPart{{Type: "input_text", Text: s}}}}, nil
	}
	var raw []json.RawMessage
	if kind(v) != '[' || json.Unmarshal(v, &raw) != nil {
		return nil, invalidRequest("input", "Invalid type for 'input': expected a string or an array of input items.")
	}
	if len(raw) == 0 {
		return nil, invalidRequest("input", "Invalid 'input': empty array. Expected an array with minimum length 1.")
	}
	items := make([]respItem, 0, len(raw))
	for i, rv := range raw {
		var it struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		if kind(rv) != '{' || json.Unmarshal(rv, &it) != nil {
			return nil, invalidRequest(fmt.Sprintf("input[%d]", i), "Invalid type for 'input[%d]': expected an input item object.", i)
		}
		if it.Type != "" && it.Type != "message" {
			return nil, invalidRequest(fmt.Sprintf("input[%d].type", i), "The input item type '%s' is not supported by this gateway; "+
				"it serves message items with text content.", it.Type)
		}
		if !inputRoles[it.Role] {
			return nil, invalidRequest(fmt.Sprintf("input[%d].role", i), "Invalid value for 'input[%d].role': %q is not one of user, system, developer, assistant.", i, it.Role)
		}
		item := respItem{Type: "message", Role: it.Role}
		partType := "input_text"
		if it.Role == "assistant" {
			partType = "output_text"
		}
		switch kind(it.Content) {
		case '"':
			var s string
			_ = json.Unmarshal(it.Content, &s)
			item.Content = []respPart{{Type: partType, Text: s}}
		case '[':
			var parts []struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if json.Unmarshal(it.Content, &parts) != nil {
				return nil, invalidRequest(fmt.Sprintf("input[%d].content", i), "Invalid type for 'input[%d].content': expected a string or an array of content parts.", i)
			}
			for j, p := range parts {
				if (p.Type != "input_text" && p.Type != "output_text") || p.Text == nil {
					return nil, invalidRequest(fmt.Sprintf("input[%d].content[%d].type", i, j),
						"The content part type '%s' is not supported by this gateway; it serves input_text and output_text parts.", p.Type)
				}
				item.Content = append(item.Content, respPart{Type: partType, Text: *p.Text})
			}
		default:
			return nil, invalidRequest(fmt.Sprintf("input[%d].content", i), "Invalid type for 'input[%d].content': expected a string or an array of content parts.", i)
		}
		items = append(items, item)
	}
	return items, nil
}

// chatMessage is a message of the engine's chat request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatBody is the engine's chat completions request for r, with history
// (a previous response's conversation, output included) in front of its
// input. developer becomes system, which every engine knows.
func (r *responsesRequest) chatBody(history []respItem) []byte {
	var msgs []chatMessage
	if r.Instructions != nil {
		msgs = append(msgs, chatMessage{Role: "system", Content: *r.Instructions})
	}
	for _, it := range slices.Concat(history, r.Input) {
		role := it.Role
		if role == "developer" {
			role = "system"
		}
		msgs = append(msgs, chatMessage{Role: role, Content: it.text()})
	}
	req := map[string]any{"model": r.Model, "messages": msgs}
	if r.Stream {
		req["stream"] = true
		req["stream_options"] = map[string]bool{"include_usage": true}
	}
	if r.MaxOutputTokens != nil {
		req["max_tokens"] = *r.MaxOutputTokens
	}
	if r.Temperature != nil {
		req["temperature"] = *r.Temperature
	}
	if r.TopP != nil {
		req["top_p"] = *r.TopP
	}
	if r.User != nil {
		req["user"] = *r.User
	}
	if r.responseFormat != nil {
		req["response_format"] = r.responseFormat
	}
	b, _ := json.Marshal(req) // plain values: cannot fail
	return b
}

// newResponse is the response object for r, in progress, without output.
func (r *responsesRequest) newResponse(id string, created time.Time) responseObject {
	ro := responseObject{
		ID: id, Object: "response", CreatedAt: created.Unix(), Status: "in_progress",
		Error: json.RawMessage("null"), IncompleteDetails: json.RawMessage("null"),
		Instructions: r.Instructions, MaxOutputTokens: r.MaxOutputTokens, Model: r.Model,
		Output: []respItem{}, ParallelToolCalls: true, Store: r.Store, Temperature: r.Temperature, TopP: r.TopP,
		Text: r.Text, ToolChoice: "auto", Tools: []any{}, Truncation: "disabled", User: r.User,
		Metadata: r.Metadata,
	}
	if r.PreviousID != "" {
		ro.PreviousResponseID = &r.PreviousID
	}
	if ro.Metadata == nil {
		ro.Metadata = json.RawMessage("{}")
	}
	return ro
}

// finish completes ro with the answer text, the chat finish reason and
// the usage.
func (ro *responseObject) finish(msgID, text, finishReason string, u usage) {
	ro.Status = "completed"
	if finishReason == "length" {
		ro.Status = "incomplete"
		ro.IncompleteDetails = json.RawMessage(`{"reason":"max_output_tokens"}`)
	}
	ro.Output = []respItem{{ID: msgID, Type: "message", Status: "completed", Role: "assistant", Content: []respPart{outputPart(text)}}}
	ro.Usage = responsesUsage(u)
}

// chatAnswer reads a non-streamed chat completion: the first choice's text
// and finish reason.
func chatAnswer(body []byte) (text, finishReason string, err error) {
	var c struct {
		Choices []struct {
			Message struct {
				Content *string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &c); err != nil {
		return "", "", fmt.Errorf("the model server's chat completion is not JSON: %w", err)
	}
	if len(c.Choices) == 0 {
		return "", "", errors.New("the model server's chat completion has no choices")
	}
	if p := c.Choices[0].Message.Content; p != nil {
		text = *p
	}
	return text, c.Choices[0].FinishReason, nil
}

// badAnswer is the error for an engine answer the gateway cannot translate.
func badAnswer(err error) *apiError {
	return &apiError{status: http.StatusBadGateway, err: err, typ: typeServer, code: "bad_engine_answer",
		message: "The model server's answer could not be translated to a response."}
}

// responseNotFound is the 404 for an unknown, expired, deleted or foreign
// response id.
func responseNotFound(param, id string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, param: param, reason: reasonNotFound,
		message: fmt.Sprintf("Response with id '%s' not found.", id)}
}

// validResponseID reports whether id can be a response id of this gateway.
func validResponseID(id string) bool {
	if !strings.HasPrefix(id, "resp_") || len(id) > 128 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c == '_', c == '-', c >= '0' && c <= '9', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		default:
			return false
		}
	}
	return true
}

// loadResponse reads a stored response of owner; nil when there is none.
func (g *Gateway) loadResponse(ctx context.Context, owner, id string) (*storedResponse, error) {
	if g.responses == nil || !validResponseID(id) {
		return nil, nil
	}
	b, err := g.responses.Get(ctx, responseKey(owner, id))
	if err != nil || b == nil {
		return nil, err
	}
	var s storedResponse
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decoding stored response %s: %w", id, err)
	}
	return &s, nil
}
