package batch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"unicode"
	"unicode/utf8"
)

// InputError is a problem in a batch input file; Line counts from 1.
type InputError struct {
	Line    int
	Param   string
	Message string
}

func (e *InputError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d: %s", e.Line, e.Message)
	}
	return e.Message
}

// MaxCustomIDBytes bounds a line's custom_id.
const MaxCustomIDBytes = 512

// ParseInput splits a batch input file into its lines and checks each:
// a JSON object with a unique custom_id, method POST, a url among
// Endpoints and a body object with a model. check, when set, validates
// each body for its url further (the gateway's request checks). A last
// line may end without a newline; blank lines are refused.
func ParseInput(data []byte, maxLines int, check func(url string, body []byte) error) ([]InputLine, error) {
	if len(data) == 0 {
		return nil, &InputError{Message: "The file is empty: a batch input file has one JSON request per line."}
	}
	if !utf8.Valid(data) {
		return nil, &InputError{Message: "The file is not valid UTF-8."}
	}
	data = bytes.TrimSuffix(data, []byte("\n"))
	var lines []InputLine
	seen := map[string]int{}
	n := 0
	for raw := range bytes.Lines(data) {
		n++
		if n > maxLines {
			return nil, &InputError{Message: fmt.Sprintf("The file has more than %d lines, the most a batch may have.", maxLines)}
		}
		raw = bytes.TrimRight(raw, "\r\n")
		l, err := parseLine(raw, check)
		if err != nil {
			err.Line = n
			return nil, err
		}
		if first, dup := seen[l.CustomID]; dup {
			return nil, &InputError{Line: n, Param: "custom_id",
				Message: fmt.Sprintf("custom_id %q is already used on line %d: each line needs a unique custom_id.", l.CustomID, first)}
		}
		seen[l.CustomID] = n
		lines = append(lines, l)
	}
	return lines, nil
}

func parseLine(raw []byte, check func(string, []byte) error) (InputLine, *InputError) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return InputLine{}, &InputError{Message: "The line is empty: every line must be one JSON request object."}
	}
	var l InputLine
	dec := json.NewDecoder(bytes.NewReader(raw))
	if raw[0] != '{' || dec.Decode(&l) != nil || dec.More() {
		return InputLine{}, &InputError{Message: "The line is not a JSON object: every line must be one JSON request object " +
			`such as {"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}.`}
	}
	switch {
	case l.CustomID == "":
		return l, &InputError{Param: "custom_id", Message: "custom_id is missing: each line needs a unique custom_id string."}
	case len(l.CustomID) > MaxCustomIDBytes:
		return l, &InputError{Param: "custom_id", Message: fmt.Sprintf("custom_id is longer than %d bytes.", MaxCustomIDBytes)}
	case hasControl(l.CustomID):
		return l, &InputError{Param: "custom_id", Message: "custom_id must not contain control characters."}
	case l.Method != "POST":
		return l, &InputError{Param: "method", Message: fmt.Sprintf("method is %q: only POST is supported.", l.Method)}
	case !slices.Contains(Endpoints, l.URL):
		return l, &InputError{Param: "url", Message: fmt.Sprintf("url %q is not supported in a batch: use one of %v.", l.URL, Endpoints)}
	case len(l.Body) == 0 || l.Body[0] != '{':
		return l, &InputError{Param: "body", Message: "body must be a JSON object: the request to send to url."}
	}
	var b struct {
		Model  any `json:"model"`
		Stream any `json:"stream"`
	}
	_ = json.Unmarshal(l.Body, &b)
	if s, ok := b.Model.(string); !ok || s == "" {
		return l, &InputError{Param: "body.model", Message: "body.model must name the model (a string)."}
	}
	if b.Stream == true {
		return l, &InputError{Param: "body.stream", Message: "body.stream is true: batch requests cannot stream."}
	}
	if check != nil {
		if err := check(l.URL, l.Body); err != nil {
			return l, &InputError{Param: "body", Message: "body: " + err.Error()}
		}
	}
	return l, nil
}

// hasControl reports whether s holds a control character.
func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}

// Model is the model a line's body names.
func (l InputLine) Model() string {
	var b struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(l.Body, &b)
	return b.Model
}
