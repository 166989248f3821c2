package sim

// JSON answers, OpenAI-style errors and the SSE writer.

import (
	"encoding/json"
	"net/http"
	"strconv"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status, body = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding response","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	typ := "BadRequestError"
	if status >= 500 {
		typ = "InternalServerError"
	}
	writeErrorType(w, status, typ, msg)
}

func writeErrorType(w http.ResponseWriter, status int, typ, msg string) {
	writeJSON(w, status, errorBody{Error: errorDetail{Message: msg, Type: typ, Code: status}})
}

// sseWriter writes server-sent events the way vLLM does.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	buf []byte
}

func newSSEWriter(w http.ResponseWriter) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w)}
}

func (s *sseWriter) event(v any) {
	s.buf = append(s.buf, "data: "...)
	b, _ := json.Marshal(v)
	s.buf = append(s.buf, b...)
	s.buf = append(s.buf, "\n\n"...)
}

func (s *sseWriter) flush() {
	_, _ = s.w.Write(s.buf)
	s.buf = s.buf[:0]
	_ = s.rc.Flush()
}

func (s *sseWriter) done() {
	s.buf = append(s.buf, "data: [DONE]\n\n"...)
	s.flush()
}
