package sim

// The OpenAI endpoints: chat and text completions, embeddings and the
// model list; each decodes its request and hands a generation to stream.go.

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

func (s *Simulator) chatCompletions(w http.ResponseWriter, r *http.Request) {
	var req chatRequest
	if !s.decode(w, r, &req) {
		return
	}
	if len(req.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages must not be empty")
		return
	}
	g := &generation{chat: true, model: req.Model, stream: req.Stream, ignoreEOS: req.IgnoreEOS, minTokens: req.MinTokens}
	if req.StreamOptions != nil {
		g.includeUsage = req.StreamOptions.IncludeUsage
	}
	switch {
	case req.MaxCompletionTokens != nil:
		g.maxTokens = *req.MaxCompletionTokens
	case req.MaxTokens != nil:
		g.maxTokens = *req.MaxTokens
	}
	parts := make([]string, 0, 2*len(req.Messages)+1)
	for _, m := range req.Messages {
		text := m.text()
		parts = append(parts, m.Role, text)
		g.promptTokens += countTokens(text) + 4 // role and template tokens
	}
	if req.Seed != nil {
		parts = append(parts, strconv.FormatInt(*req.Seed, 10))
	}
	if s.prefix != nil || s.prefill.rate > 0 {
		g.prompts = [][]string{chatTokens(req.Messages)}
	}
	n, ok := choices(w, req.N)
	if !ok {
		return
	}
	for i := range n {
		g.seeds = append(g.seeds, seedOf(append(parts, strconv.Itoa(i))...))
	}
	s.generate(w, r, g)
}

func (s *Simulator) completions(w http.ResponseWriter, r *http.Request) {
	var req completionRequest
	if !s.decode(w, r, &req) {
		return
	}
	texts, tokens, toks, err := req.prompts()
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	g := &generation{model: req.Model, stream: req.Stream, ignoreEOS: req.IgnoreEOS, minTokens: req.MinTokens}
	if req.StreamOptions != nil {
		g.includeUsage = req.StreamOptions.IncludeUsage
	}
	if req.MaxTokens != nil {
		g.maxTokens = *req.MaxTokens
	} else {
		g.maxTokens = 16 // the OpenAI default for completions
	}
	n, ok := choices(w, req.N)
	if !ok {
		return
	}
	for p, text := range texts {
		if s.prefix != nil || s.prefill.rate > 0 {
			g.prompts = append(g.prompts, toks[p])
		}
		g.promptTokens += tokens[p] * n
		for i := range n {
			var seed []string
			if req.Seed != nil {
				seed = []string{strconv.FormatInt(*req.Seed, 10)}
			}
			g.seeds = append(g.seeds, seedOf(append([]string{"prompt", text, strconv.Itoa(i)}, seed...)...))
		}
	}
	g.promptTokens /= n
	s.generate(w, r, g)
}

func choices(w http.ResponseWriter, n *int) (int, bool) {
	if n == nil {
		return 1, true
	}
	if *n < 1 || *n > 16 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("n must be between 1 and 16, got %d", *n))
		return 0, false
	}
	return *n, true
}

// decode reads a JSON body and checks the model name.
func (s *Simulator) decode(w http.ResponseWriter, r *http.Request, v interface{ model() *string }) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("reading request body: %v", err))
		return false
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return false
	}
	m := v.model()
	if *m == "" {
		*m = s.cfg.Model
	}
	if *m != s.cfg.Model {
		writeErrorType(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", *m))
		return false
	}
	return true
}

func (r *chatRequest) model() *string       { return &r.Model }
func (r *completionRequest) model() *string { return &r.Model }
func (r *embeddingRequest) model() *string  { return &r.Model }

func (s *Simulator) embeddings(w http.ResponseWriter, r *http.Request) {
	var req embeddingRequest
	if !s.decode(w, r, &req) {
		return
	}
	var inputs []string
	var tokens int
	var one string
	var many []string
	var ids []int
	var idLists [][]int
	switch {
	case json.Unmarshal(req.Input, &one) == nil:
		inputs, tokens = []string{one}, countTokens(one)
	case json.Unmarshal(req.Input, &many) == nil && len(many) > 0:
		inputs = many
		for _, in := range many {
			tokens += countTokens(in)
		}
	case json.Unmarshal(req.Input, &ids) == nil && len(ids) > 0:
		inputs, tokens = []string{string(req.Input)}, len(ids)
	case json.Unmarshal(req.Input, &idLists) == nil && len(idLists) > 0:
		for _, l := range idLists {
			enc, _ := json.Marshal(l)
			inputs = append(inputs, string(enc))
			tokens += len(l)
		}
	default:
		writeError(w, http.StatusBadRequest, "input must be a string, a list of strings or token ids")
		return
	}
	dim := s.cfg.EmbeddingDim
	if req.Dimensions != nil {
		if *req.Dimensions < 1 || *req.Dimensions > s.cfg.EmbeddingDim {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("dimensions must be between 1 and %d", s.cfg.EmbeddingDim))
			return
		}
		dim = *req.Dimensions
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported encoding_format %q", req.EncodingFormat))
		return
	}
	if err := s.enter(); err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	defer s.leave()
	s.m.promptTokens.Add(float64(tokens))
	resp := embeddingResponse{ID: s.newID("embd-"), Object: "list", Created: time.Now().Unix(), Model: req.Model,
		Usage: usage{PromptTokens: tokens, TotalTokens: tokens}}
	for i, in := range inputs {
		v := embedding(in, dim)
		d := embeddingData{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			d.Embedding = base64.StdEncoding.EncodeToString(float32sLE(v))
		}
		resp.Data = append(resp.Data, d)
	}
	s.m.success.WithLabelValues("stop").Inc()
	writeJSON(w, http.StatusOK, resp)
}

func (s *Simulator) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: "list", Data: []modelCard{{
		ID: s.cfg.Model, Object: "model", Created: s.created, OwnedBy: "vllm", Root: s.cfg.Model,
		MaxModelLen: s.cfg.MaxModelLen, Permission: []any{},
	}}})
}
