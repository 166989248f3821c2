package fetch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"syscall"
	"time"
)

// Exit codes of orchestra-fetch. They are part of the Job contract.
const (
	ExitOK           = 0
	ExitInternal     = 1 // anything not covered below
	ExitBadInput     = 2 // invalid flags/config, source not found, access denied
	ExitVerification = 3 // checksum, size or format check failed
	ExitNoSpace      = 4 // not enough space in the cache filesystem
	ExitNetwork      = 5 // the source kept failing and the retries ran out
	ExitCanceled     = 6 // SIGTERM/SIGINT; rerun resumes
)

var (
	// ErrInvalidConfig means the flags or environment do not make a valid run.
	ErrInvalidConfig = errors.New("invalid configuration")
	// ErrNotFound means the source (repository, revision, bucket, file) does not exist.
	ErrNotFound = errors.New("source not found")
	// ErrAccessDenied means the source refused the credentials (or their absence).
	ErrAccessDenied = errors.New("access denied")
	// ErrVerification means a file's size, checksum or format is not what it must be.
	ErrVerification = errors.New("verification failed")
	// ErrNoSpace means the cache filesystem cannot hold the files.
	ErrNoSpace = errors.New("not enough disk space")
	// ErrGaveUp means a download kept failing until the retries ran out.
	ErrGaveUp = errors.New("gave up after retries")
)

// ExitCode maps an error returned by Run to the process exit code.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.Is(err, ErrInvalidConfig), errors.Is(err, ErrNotFound), errors.Is(err, ErrAccessDenied):
		return ExitBadInput
	case errors.Is(err, ErrVerification):
		return ExitVerification
	case errors.Is(err, ErrNoSpace), errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return ExitNoSpace
	case errors.Is(err, ErrGaveUp):
		return ExitNetwork
	case errors.Is(err, context.Canceled):
		return ExitCanceled
	default:
		return ExitInternal
	}
}

// statusError is a non-success HTTP (or S3) status from the source.
type statusError struct {
	Code       int
	What       string
	RetryAfter time.Duration
	// Detail is the server's own explanation (the hub's X-Error-Message).
	Detail string
}

func (e *statusError) Error() string {
	msg := fmt.Sprintf("%s: HTTP %d %s", e.What, e.Code, http.StatusText(e.Code))
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if class := e.Unwrap(); class != nil {
		msg += " (" + class.Error() + ")"
	}
	return msg
}

// Unwrap classifies the status for errors.Is.
func (e *statusError) Unwrap() error {
	switch e.Code {
	case http.StatusNotFound, http.StatusGone:
		return ErrNotFound
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrAccessDenied
	}
	return nil
}

func newStatusError(resp *http.Response, what string) *statusError {
	e := &statusError{Code: resp.StatusCode, What: what}
	if d := resp.Header.Get("X-Error-Message"); len(d) <= 300 {
		e.Detail = d
	}
	if s := resp.Header.Get("Retry-After"); s != "" {
		if secs, err := strconv.Atoi(s); err == nil && secs >= 0 {
			e.RetryAfter = time.Duration(secs) * time.Second
		}
	}
	return e
}

// permanentError marks an error that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

func permanent(err error) error { return &permanentError{err} }

// retryable tells whether another attempt might succeed.
func retryable(err error) bool {
	if err == nil {
		return false
	}
	var pe *permanentError
	if errors.As(err, &pe) {
		return false
	}
	if errors.Is(err, ErrNoSpace) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) ||
		errors.Is(err, ErrVerification) || errors.Is(err, ErrInvalidConfig) {
		return false
	}
	var se *statusError
	if errors.As(err, &se) {
		switch {
		case se.Code == http.StatusRequestTimeout, se.Code == http.StatusTooManyRequests:
			return true
		case se.Code >= 500:
			return true
		default:
			return false
		}
	}
	// Network errors, unexpected EOFs, stalls, per-request timeouts.
	return true
}
