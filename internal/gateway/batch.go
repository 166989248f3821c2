package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"unicode/utf8"

	"github.com/model-orchestra/operator/internal/batch"
)

// batchCreate is the body of POST /v1/batches.
type batchCreate struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// createBatch serves POST /v1/batches: it checks the input file's lines
// against the endpoint and the caller's models, then stores the batch,
// which the batch driver runs.
func (g *Gateway) createBatch(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	body, err := g.readBody(w, r)
	if err != nil {
		return err
	}
	var req batchCreate
	if kind(body) != '{' || json.Unmarshal(body, &req) != nil {
		return invalidRequest("", "We could not parse the JSON body of your request: expected an object with "+
			"input_file_id, endpoint and completion_window.")
	}
	switch {
	case req.InputFileID == "":
		return invalidRequest("input_file_id", "Missing required parameter: 'input_file_id'.")
	case req.Endpoint == "":
		return invalidRequest("endpoint", "Missing required parameter: 'endpoint'.")
	case !slices.Contains(batch.Endpoints, req.Endpoint):
		return invalidRequest("endpoint", "Invalid 'endpoint': %q. Batches on this gateway support %v.", req.Endpoint, batch.Endpoints)
	case req.CompletionWindow != batch.CompletionWindow:
		return invalidRequest("completion_window", "Invalid 'completion_window': %q. The only supported window is '24h'.", req.CompletionWindow)
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return err
	}
	f, err := g.batches.GetFile(r.Context(), owner, req.InputFileID)
	if err != nil {
		return batchStoreError(err, "File", req.InputFileID)
	}
	if f.Purpose != batch.PurposeBatch {
		return invalidRequest("input_file_id", "File %s has purpose %q; a batch input file needs purpose 'batch'.", f.ID, f.Purpose)
	}
	data, err := g.batches.FileContent(r.Context(), owner, req.InputFileID)
	if err != nil {
		return batchStoreError(err, "File", req.InputFileID)
	}
	lines, err := batch.ParseInput(data, g.cfg.Batch.MaxLines, g.checkBatchBody)
	if err != nil {
		return inputFileError(err)
	}
	model := lines[0].Model()
	for i, l := range lines {
		if l.URL != req.Endpoint {
			return inputFileError(&batch.InputError{Line: i + 1, Param: "url",
				Message: fmt.Sprintf("url %q differs from the batch's endpoint %q: every line must use the batch's endpoint.", l.URL, req.Endpoint)})
		}
		if m := l.Model(); m != model {
			return inputFileError(&batch.InputError{Line: i + 1, Param: "body.model",
				Message: fmt.Sprintf("model %q differs from line 1's %q: a batch runs one model.", m, model)})
		}
	}
	m, ok := g.models[model]
	if !ok || !p.mayUse(model) {
		return modelNotFound(model, ok)
	}
	b, err := g.batches.CreateBatch(r.Context(), owner, batch.CreateParams{
		InputFileID: req.InputFileID, Endpoint: req.Endpoint, CompletionWindow: req.CompletionWindow,
		Metadata: req.Metadata, App: m.App, Lines: len(lines),
	})
	if err != nil {
		return batchStoreError(err, "Batch", "")
	}
	writeJSON(w, http.StatusOK, b)
	return nil
}

// checkMetadata applies OpenAI's metadata limits: 16 pairs, keys up to 64
// and values up to 512 characters.
func checkMetadata(md map[string]string) error {
	if len(md) > 16 {
		return invalidRequest("metadata", "Invalid 'metadata': at most 16 key-value pairs, got %d.", len(md))
	}
	for k, v := range md {
		if utf8.RuneCountInString(k) > 64 || utf8.RuneCountInString(v) > 512 {
			return invalidRequest("metadata", "Invalid 'metadata': keys may have 64 and values 512 characters at most (key %q).", k)
		}
	}
	return nil
}

// getBatch serves GET /v1/batches/{id}.
func (g *Gateway) getBatch(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	id := r.PathValue("id")
	b, err := g.batches.GetBatch(r.Context(), owner, id)
	if err != nil {
		return batchStoreError(err, "Batch", id)
	}
	writeJSON(w, http.StatusOK, b)
	return nil
}

// cancelBatch serves POST /v1/batches/{id}/cancel.
func (g *Gateway) cancelBatch(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	id := r.PathValue("id")
	b, err := g.batches.CancelBatch(r.Context(), owner, id)
	if errors.Is(err, batch.ErrNotCancellable) {
		return &apiError{status: http.StatusConflict, typ: typeInvalidRequest, reason: reasonInvalidRequest,
			message: fmt.Sprintf("Cannot cancel a batch with status %s.", b.Status)}
	}
	if err != nil {
		return batchStoreError(err, "Batch", id)
	}
	writeJSON(w, http.StatusOK, b)
	return nil
}

// listBatches serves GET /v1/batches: the caller's batches, newest first,
// limit (1-100, default 20) at a time after the batch id after.
func (g *Gateway) listBatches(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	q := r.URL.Query()
	limit, err := listLimit(q.Get("limit"), 20, 100)
	if err != nil {
		return err
	}
	all, err := g.batches.ListBatches(r.Context(), owner)
	if err != nil {
		return batchStoreError(err, "Batch", "")
	}
	page, more, err := pageAfter(all, q.Get("after"), limit, func(b batch.Batch) string { return b.ID })
	if err != nil {
		return err
	}
	writeList(w, page, more, func(b batch.Batch) string { return b.ID })
	return nil
}
