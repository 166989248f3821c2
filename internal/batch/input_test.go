package batch

import (
	"errors"
	"strings"
	"testing"
)

func TestParseInput(t *testing.T) {
	const good = `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}`
	second := strings.Replace(good, `"a"`, `"b"`, 1)
	for _, tc := range []struct {
		name      string
		data      string
		maxLines  int
		wantLines int
		wantLine  int
		wantParam string
		wantMsg   string
	}{
		{name: "two lines", data: good + "\n" + second + "\n", wantLines: 2},
		{name: "no final newline", data: good + "\n" + second, wantLines: 2},
		{name: "crlf", data: good + "\r\n" + second + "\r\n", wantLines: 2},
		{name: "empty", data: "", wantMsg: "empty"},
		{name: "blank line", data: good + "\n\n" + second, wantLine: 2, wantMsg: "empty"},
		{name: "array", data: "[1]", wantLine: 1, wantMsg: "not a JSON object"},
		{name: "two objects on a line", data: good + good, wantLine: 1, wantMsg: "not a JSON object"},
		{name: "duplicate", data: good + "\n" + good, wantLine: 2, wantParam: "custom_id", wantMsg: "already used on line 1"},
		{name: "control character", data: strings.Replace(good, `"a"`, `"a\n"`, 1), wantLine: 1, wantParam: "custom_id"},
		{name: "method", data: strings.Replace(good, "POST", "PUT", 1), wantLine: 1, wantParam: "method"},
		{name: "url", data: strings.Replace(good, "/v1/chat/completions", "/v1/responses", 1), wantLine: 1, wantParam: "url"},
		{name: "body not an object", data: strings.Replace(good, `{"model":"m","messages":[]}`, `"x"`, 1), wantLine: 1, wantParam: "body"},
		{name: "model not a string", data: strings.Replace(good, `"model":"m"`, `"model":1`, 1), wantLine: 1, wantParam: "body.model"},
		{name: "stream", data: strings.Replace(good, `"model"`, `"stream":true,"model"`, 1), wantLine: 1, wantParam: "body.stream"},
		{name: "too many lines", data: good + "\n" + second, maxLines: 1, wantMsg: "more than 1 lines"},
		{name: "invalid UTF-8", data: "\xff", wantMsg: "UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			maxLines := tc.maxLines
			if maxLines == 0 {
				maxLines = 100
			}
			lines, err := ParseInput([]byte(tc.data), maxLines, nil)
			if tc.wantMsg == "" && tc.wantParam == "" {
				if err != nil || len(lines) != tc.wantLines {
					t.Fatalf("ParseInput = %d lines, %v; want %d lines", len(lines), err, tc.wantLines)
				}
				return
			}
			var ie *InputError
			if !errors.As(err, &ie) {
				t.Fatalf("ParseInput error = %v, want an InputError", err)
			}
			if ie.Line != tc.wantLine || ie.Param != tc.wantParam || !strings.Contains(ie.Message, tc.wantMsg) {
				t.Errorf("InputError{Line: %d, Param: %q, Message: %q}, want line %d, param %q, message containing %q",
					ie.Line, ie.Param, ie.Message, tc.wantLine, tc.wantParam, tc.wantMsg)
			}
		})
	}
}
