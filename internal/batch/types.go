// Package batch holds the OpenAI Batch API and Files API of a model
// orchestra: the wire types, the JetStream store of files (an object
// store), batches and per-line results (key-value buckets), the driver that
// takes a batch through its statuses, and the results a dispatcher writes.
//
// A batch's lines wait in a stream of their own (natsqueue.Names.BatchStream);
// a dispatcher moves one into the application's request subject only while
// the application has spare capacity and no interactive request waits
// (internal/dispatch, batch.go). Every line's result is written once, keyed
// by batch and line (a key-value Create: the first write wins), so a line
// that runs twice after a restart still has exactly one result; the counts
// and the output files are derived from those results.
package batch

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// Statuses of a batch, as OpenAI names them.
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// Terminal reports whether a batch with this status is done.
func Terminal(status string) bool {
	switch status {
	case StatusCompleted, StatusFailed, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// Purposes of files.
const (
	PurposeBatch       = "batch"
	PurposeBatchOutput = "batch_output"
)

// Endpoints a batch may target.
var Endpoints = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}

// CompletionWindow is the only completion window, as at OpenAI.
const CompletionWindow = "24h"

// File is an OpenAI file object.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	Status    string `json:"status"`
	// ExpiresAt is null: files are kept until deleted.
	ExpiresAt *int64 `json:"expires_at"`
}

// RequestCounts are a batch's line counts.
type RequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// LineError is one entry of a batch's errors.
type LineError struct {
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	Line    *int    `json:"line"`
}

// Errors is a failed batch's errors.
type Errors struct {
	Object string      `json:"object"`
	Data   []LineError `json:"data"`
}

// Batch is an OpenAI batch object.
type Batch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Endpoint         string            `json:"endpoint"`
	Errors           *Errors           `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        *int64            `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
}

// InputLine is one line of a batch input file.
type InputLine struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// OutputLine is one line of a batch's output or error file.
type OutputLine struct {
	ID       string          `json:"id"`
	CustomID string          `json:"custom_id"`
	Response *LineResponse   `json:"response"`
	Error    *LineErrorShort `json:"error"`
}

// LineResponse is the engine's answer to a line.
type LineResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"`
	Body       json.RawMessage `json:"body"`
}

// LineErrorShort is why a line has no answer.
type LineErrorShort struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Succeeded reports whether the line belongs in the output file (the
// engine answered 2xx); every other line goes to the error file.
func (l *OutputLine) Succeeded() bool {
	return l.Error == nil && l.Response != nil && l.Response.StatusCode >= 200 && l.Response.StatusCode < 300
}

// Error codes of lines that did not run.
const (
	CodeExpired   = "batch_expired"
	CodeCancelled = "batch_cancelled"
	CodeFailed    = "server_error"
)

// LineID is the deterministic id of a batch line's result.
func LineID(batchID string, line int) string {
	return "batch_req_" + digest(batchID, line)
}

func digest(batchID string, line int) string {
	b, _ := json.Marshal([]any{batchID, line})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// NewFileID returns a fresh file id.
func NewFileID() string { return "file-" + randomHex() }

// NewBatchID returns a fresh batch id.
func NewBatchID() string { return "batch_" + randomHex() }

// resultFileID is the id of a batch's output or error file (kind), the same
// whichever gateway writes it.
func resultFileID(batchID, kind string) string {
	sum := sha256.Sum256([]byte(batchID + "/" + kind))
	return "file-" + hex.EncodeToString(sum[:12])
}

func randomHex() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// OwnerKey is the key part naming a token's data: other tokens compute
// other keys, so they cannot find it.
func OwnerKey(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return hex.EncodeToString(sum[:16])
}
