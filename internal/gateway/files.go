package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/model-orchestra/operator/internal/batch"
)

// Batches serves the Files and Batch APIs; *batch.Service implements it on
// JetStream. Owners are token names: a token sees only its own files and
// batches (others get 404).
type Batches interface {
	CreateFile(ctx context.Context, owner, filename, purpose string, data []byte) (batch.File, error)
	GetFile(ctx context.Context, owner, id string) (batch.File, error)
	FileContent(ctx context.Context, owner, id string) ([]byte, error)
	ListFiles(ctx context.Context, owner string) ([]batch.File, error)
	DeleteFile(ctx context.Context, owner, id string) error
	CreateBatch(ctx context.Context, owner string, p batch.CreateParams) (batch.Batch, error)
	GetBatch(ctx context.Context, owner, id string) (batch.Batch, error)
	ListBatches(ctx context.Context, owner string) ([]batch.Batch, error)
	CancelBatch(ctx context.Context, owner, id string) (batch.Batch, error)
}

// batchAPI wraps the handlers of the Files and Batch APIs: authentication,
// the metrics and the access log.
func (g *Gateway) batchAPI(ep endpoint, h func(w http.ResponseWriter, r *http.Request, p *Principal) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		x := &exchange{start: time.Now(), id: newRequestID(), endpoint: ep, model: modelNone}
		w.Header().Set("X-Request-Id", x.id)
		p, err := g.authenticate(r)
		if err == nil && g.batches == nil {
			err = &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, reason: reasonNotFound,
				message: "The Files and Batch APIs are not enabled on this gateway."}
		}
		if err == nil {
			x.consumer = p.Name
			err = h(w, r, p)
		}
		if err != nil {
			g.fail(w, x, err)
		} else {
			x.status = http.StatusOK
		}
		g.record(r, x)
	}
}

// batchStoreError maps the store's errors: not found is a 404 naming the
// object, anything else a retryable 503.
func batchStoreError(err error, kind, id string) error {
	if errors.Is(err, batch.ErrNotFound) {
		return &apiError{status: http.StatusNotFound, typ: typeInvalidRequest, reason: reasonNotFound,
			message: fmt.Sprintf("No such %s object: %s", kind, id), err: err}
	}
	return &apiError{status: http.StatusServiceUnavailable, err: err, typ: typeServer, code: "service_unavailable",
		retryAfter: time.Second, message: "The file and batch store is unavailable; retry the request."}
}

// uploadFile serves POST /v1/files: a multipart form with purpose
// ("batch") and file (a JSONL batch input, checked line by line).
func (g *Gateway) uploadFile(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	limit := g.cfg.Batch.MaxFileBytes
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt != "multipart/form-data" {
		return invalidRequest("", "Upload files as multipart/form-data with the fields 'purpose' and 'file'.")
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit+1<<20) // the form's other parts and boundaries
	mr, err := r.MultipartReader()
	if err != nil {
		return invalidRequest("", "Could not read the multipart form: %v.", err)
	}
	var purpose, filename string
	var data []byte
	var haveFile bool
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return uploadReadError(err, limit)
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(part, 256))
			if err != nil {
				return uploadReadError(err, limit)
			}
			purpose = string(b)
		case "file":
			filename, haveFile = part.FileName(), true
			data, err = io.ReadAll(io.LimitReader(part, limit+1))
			if err != nil {
				return uploadReadError(err, limit)
			}
			if int64(len(data)) > limit {
				return fileTooLarge(limit)
			}
		}
		_ = part.Close()
	}
	switch {
	case !haveFile:
		return invalidRequest("file", "The 'file' field is missing: attach the JSONL file.")
	case purpose == "":
		return invalidRequest("purpose", "The 'purpose' field is missing: use 'batch'.")
	case purpose != batch.PurposeBatch:
		return invalidRequest("purpose", "Invalid 'purpose': %q. This gateway accepts files with purpose 'batch'.", purpose)
	}
	if filename == "" {
		filename = "upload.jsonl"
	}
	if _, err := batch.ParseInput(data, g.cfg.Batch.MaxLines, g.checkBatchBody); err != nil {
		return inputFileError(err)
	}
	f, err := g.batches.CreateFile(r.Context(), owner, filename, purpose, data)
	if err != nil {
		return batchStoreError(err, "File", "")
	}
	writeJSON(w, http.StatusOK, f)
	return nil
}

func uploadReadError(err error, limit int64) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return fileTooLarge(limit)
	}
	return invalidRequest("", "Could not read the upload: %v.", err)
}

func fileTooLarge(limit int64) error {
	return &apiError{status: http.StatusRequestEntityTooLarge, typ: typeInvalidRequest, param: "file",
		code: "file_too_large", reason: reasonBodyTooLarge,
		message: fmt.Sprintf("The file is larger than %d bytes, the most this gateway accepts (batch.maxFileBytes).", limit)}
}

// inputFileError is the 400 naming the line of a batch input file and
// its problem.
func inputFileError(err error) error {
	var ie *batch.InputError
	if !errors.As(err, &ie) {
		return err
	}
	msg := ie.Message
	if ie.Line > 0 {
		msg = fmt.Sprintf("Line %d of the file: %s", ie.Line, ie.Message)
	}
	return &apiError{status: http.StatusBadRequest, typ: typeInvalidRequest, param: ie.Param,
		code: "invalid_batch_input", reason: reasonInvalidRequest, message: msg}
}

// checkBatchBody checks a batch line's body as a request to its url: the
// same checks as an interactive request, and the size a request may have.
func (g *Gateway) checkBatchBody(url string, body []byte) error {
	if int64(len(body)) > g.cfg.Limits.MaxBodyBytes {
		return fmt.Errorf("it has %d bytes, more than the %d a request may have (limits.maxBodyBytes)", len(body), g.cfg.Limits.MaxBodyBytes)
	}
	ep := endpointChat
	switch url {
	case "/v1/completions":
		ep = endpointCompletions
	case "/v1/embeddings":
		ep = endpointEmbeddings
	}
	if _, err := parseRequest(ep, body); err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			if ae.param != "" {
				return fmt.Errorf("%s (%s)", ae.message, ae.param)
			}
			return errors.New(ae.message)
		}
		return err
	}
	return nil
}

// getFile serves GET /v1/files/{id}.
func (g *Gateway) getFile(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	id := r.PathValue("id")
	f, err := g.batches.GetFile(r.Context(), owner, id)
	if err != nil {
		return batchStoreError(err, "File", id)
	}
	writeJSON(w, http.StatusOK, f)
	return nil
}

// fileContent serves GET /v1/files/{id}/content.
func (g *Gateway) fileContent(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	id := r.PathValue("id")
	b, err := g.batches.FileContent(r.Context(), owner, id)
	if err != nil {
		return batchStoreError(err, "File", id)
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
	return nil
}

// deleteFile serves DELETE /v1/files/{id}.
func (g *Gateway) deleteFile(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	id := r.PathValue("id")
	if err := g.batches.DeleteFile(r.Context(), owner, id); err != nil {
		return batchStoreError(err, "File", id)
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "file", "deleted": true})
	return nil
}

// listFiles serves GET /v1/files: the caller's files, newest first unless
// order=asc, optionally of one purpose, limit (1-10000, default 10000)
// after the file id after.
func (g *Gateway) listFiles(w http.ResponseWriter, r *http.Request, p *Principal) error {
	owner := p.Name
	q := r.URL.Query()
	limit, err := listLimit(q.Get("limit"), 10000, 10000)
	if err != nil {
		return err
	}
	order := q.Get("order")
	if order != "" && order != "asc" && order != "desc" {
		return invalidRequest("order", "Invalid 'order': expected asc or desc.")
	}
	files, err := g.batches.ListFiles(r.Context(), owner)
	if err != nil {
		return batchStoreError(err, "File", "")
	}
	if p := q.Get("purpose"); p != "" {
		files = slices.DeleteFunc(files, func(f batch.File) bool { return f.Purpose != p })
	}
	if order == "asc" {
		slices.Reverse(files)
	}
	page, more, err := pageAfter(files, q.Get("after"), limit, func(f batch.File) string { return f.ID })
	if err != nil {
		return err
	}
	writeList(w, page, more, func(f batch.File) string { return f.ID })
	return nil
}

// listLimit parses a list's limit parameter.
func listLimit(v string, def, maxLimit int) (int, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxLimit {
		return 0, invalidRequest("limit", "Invalid 'limit': expected an integer from 1 to %d.", maxLimit)
	}
	return n, nil
}

// pageAfter returns up to limit items after the one whose id is after.
func pageAfter[T any](items []T, after string, limit int, id func(T) string) ([]T, bool, error) {
	if after != "" {
		i := slices.IndexFunc(items, func(it T) bool { return id(it) == after })
		if i < 0 {
			return nil, false, invalidRequest("after", "Invalid 'after': no object with id '%s'.", after)
		}
		items = items[i+1:]
	}
	more := len(items) > limit
	return items[:min(limit, len(items))], more, nil
}

func writeList[T any](w http.ResponseWriter, items []T, more bool, id func(T) string) {
	list := map[string]any{"object": "list", "data": items, "has_more": more, "first_id": nil, "last_id": nil}
	if items == nil {
		list["data"] = []T{}
	}
	if len(items) > 0 {
		list["first_id"], list["last_id"] = id(items[0]), id(items[len(items)-1])
	}
	writeJSON(w, http.StatusOK, list)
}
