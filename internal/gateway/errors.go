package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/model-orchestra/operator/internal/queue"
)

// apiError is an error the gateway answers with, in the OpenAI error format.
// Every error a client sees goes through toAPIError, the one place where
// Go errors become HTTP statuses and OpenAI error bodies.
type apiError struct {
	status  int
	message string
	typ     string
	param   string
	code    string
	// retryAfter, when positive, is sent as the Retry-After header.
	retryAfter time.Duration
	// final tells the official SDKs not to retry (X-Should-Retry: false),
	// for a 5xx that retrying soon cannot fix.
	final bool
	// reason labels the rejection metric; empty for non-rejections.
	reason string
	// err is the cause, for logs only: clients see message.
	err error
}

func (e *apiError) Error() string {
	if e.err != nil {
		return e.message + " (" + e.err.Error() + ")"
	}
	return e.message
}

// OpenAI error types.
const (
	typeInvalidRequest = "invalid_request_error"
	typeServer         = "server_error"
	// OpenAI reports rate limits with the type naming the exhausted budget.
	typeRequestsLimit = "requests"
	typeTokensLimit   = "tokens"
)

// Rejection reasons, the values of the reason label of the rejections
// metric.
const (
	reasonUnauthenticated = "unauthenticated"
	reasonModelNotFound   = "model_not_found"
	reasonModelForbidden  = "model_forbidden"
	reasonInvalidRequest  = "invalid_request"
	reasonBodyTooLarge    = "body_too_large"
	reasonRequestRate     = "requests_per_minute"
	reasonTokenRate       = "tokens_per_minute"
	reasonConcurrency     = "concurrent_streams"
	reasonNotFound        = "not_found"
	reasonWakingTimeout   = "model_waking_timeout"
	reasonModelNotServed  = "model_not_served"
)

// Errors raised by the gateway itself, mapped by toAPIError.
var (
	// errMissingToken means the request has no bearer token.
	errMissingToken = errors.New("missing API token")
	// errInvalidToken means the bearer token is unknown or revoked.
	errInvalidToken = errors.New("invalid API token")
	// errTokensLoading means a bearer token is not known yet while the
	// token Secrets are still loading: it may be valid.
	errTokensLoading = errors.New("API tokens are still loading")
	// errEmptyReply means the queue ended a reply without any chunk.
	errEmptyReply = errors.New("the model server sent an empty answer")
	// errClientGone means writing to the client failed: it disconnected.
	errClientGone = fmt.Errorf("client disconnected: %w", context.Canceled)
)

// invalidRequest is a 400 about the request body; param names the field.
func invalidRequest(param, format string, args ...any) *apiError {
	return &apiError{
		status:  http.StatusBadRequest,
		message: fmt.Sprintf(format, args...),
		typ:     typeInvalidRequest,
		param:   param,
		reason:  reasonInvalidRequest,
	}
}

// modelNotFound is returned both for models the gateway does not serve and
// for models the caller's token may not use, as OpenAI does, so that a token
// cannot discover models it has no access to.
func modelNotFound(model string, forbidden bool) *apiError {
	reason := reasonModelNotFound
	if forbidden {
		reason = reasonModelForbidden
	}
	return &apiError{
		status:  http.StatusNotFound,
		message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", model),
		typ:     typeInvalidRequest,
		param:   "model",
		code:    "model_not_found",
		reason:  reason,
	}
}

// modelUnavailable is the 503 for a model the operator does not serve
// (ModelConfig.Unavailable): retrying cannot help until the deployment
// changes.
func modelUnavailable(model, why string) *apiError {
	return &apiError{
		status: http.StatusServiceUnavailable,
		message: fmt.Sprintf("The model `%s` is not served: %s. Ask the operator of this gateway to change the deployment "+
			"(for example a larger memory limit, a smaller model or weight type, or model.sizing).", model, why),
		typ:    typeServer,
		param:  "model",
		code:   "model_not_served",
		final:  true,
		reason: reasonModelNotServed,
	}
}

// rateLimited is a 429 for the limit named by reason.
func rateLimited(reason string, retryAfter time.Duration, format string, args ...any) *apiError {
	// Always tell the client when to come back, at least a second later.
	retryAfter = max(retryAfter, time.Second)
	typ := typeRequestsLimit
	if reason == reasonTokenRate {
		typ = typeTokensLimit
	}
	return &apiError{
		status:     http.StatusTooManyRequests,
		message:    fmt.Sprintf(format, args...),
		typ:        typ,
		code:       "rate_limit_exceeded",
		retryAfter: retryAfter,
		reason:     reason,
	}
}

// modelWakingTimeout is the 503 for a request whose application did not
// wake within its maxWait; problem explains a wake that does not progress.
func modelWakingTimeout(model string, maxWait time.Duration, problem string) *apiError {
	msg := fmt.Sprintf("The model `%s` is waking up and was not ready within %v; retry the request.", model, maxWait)
	if problem != "" {
		msg += " It cannot start: " + problem + "."
	}
	return &apiError{
		status:     http.StatusServiceUnavailable,
		message:    msg,
		typ:        typeServer,
		code:       "model_waking_timeout",
		retryAfter: 10 * time.Second,
		reason:     reasonWakingTimeout,
	}
}

// toAPIError maps any error to the status and body the client receives.
func toAPIError(err error) *apiError {
	var ae *apiError
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.Is(err, errMissingToken):
		return &apiError{
			status: http.StatusUnauthorized,
			message: "You didn't provide an API key. You need to provide your API key in an " +
				"Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).",
			typ:    typeInvalidRequest,
			code:   "missing_api_key",
			reason: reasonUnauthenticated,
		}
	case errors.Is(err, errTokensLoading):
		return &apiError{
			status:     http.StatusServiceUnavailable,
			message:    "The gateway is starting and has not loaded its API keys yet; retry the request.",
			typ:        typeServer,
			code:       "service_unavailable",
			retryAfter: time.Second,
		}
	case errors.Is(err, errInvalidToken):
		return &apiError{
			status:  http.StatusUnauthorized,
			message: "Incorrect API key provided.",
			typ:     typeInvalidRequest,
			code:    "invalid_api_key",
			reason:  reasonUnauthenticated,
		}
	case errors.As(err, &mbe):
		return &apiError{
			status:  http.StatusRequestEntityTooLarge,
			message: fmt.Sprintf("The request body is larger than the limit of %d bytes.", mbe.Limit),
			typ:     typeInvalidRequest,
			code:    "request_too_large",
			reason:  reasonBodyTooLarge,
		}
	case errors.Is(err, queue.ErrTooLarge):
		// Retrying cannot help: a 413, never a 503 with Retry-After.
		return &apiError{
			status:  http.StatusRequestEntityTooLarge,
			message: "The request body is too large to be queued; send a smaller request.",
			typ:     typeInvalidRequest,
			code:    "request_too_large",
			reason:  reasonBodyTooLarge,
		}
	case errors.Is(err, errEmptyReply):
		return &apiError{
			status:  http.StatusBadGateway,
			message: "The model server sent an empty answer.",
			typ:     typeServer,
			code:    "empty_reply",
		}
	case errors.Is(err, queue.ErrNotServed):
		// Checked before ErrUnavailable: a deployment problem, not a blip.
		return &apiError{
			status: http.StatusServiceUnavailable,
			message: "The model exists but no dispatcher serves it: none has announced its application for " +
				"longer than a request may wait. Ask the operator of this gateway to check the dispatchers.",
			typ:    typeServer,
			param:  "model",
			code:   "model_not_served",
			final:  true,
			reason: reasonModelNotServed,
		}
	case errors.Is(err, queue.ErrUnavailable):
		return &apiError{
			status:     http.StatusServiceUnavailable,
			message:    "The request queue is unavailable; retry the request.",
			typ:        typeServer,
			code:       "service_unavailable",
			retryAfter: time.Second,
		}
	case errors.Is(err, queue.ErrDeadLettered):
		return &apiError{
			status:  http.StatusBadGateway,
			message: "The model server failed to complete the request after repeated attempts.",
			typ:     typeServer,
			code:    "request_dead_lettered",
		}
	case errors.Is(err, queue.ErrRetriedAfterPartial):
		return &apiError{
			status: http.StatusBadGateway,
			message: "The model server was interrupted after part of the answer was sent; " +
				"the answer cannot be completed. Retry the request.",
			typ:  typeServer,
			code: "stream_interrupted",
		}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{
			status:  http.StatusGatewayTimeout,
			message: "The request timed out before the model server finished answering.",
			typ:     typeServer,
			code:    "timeout",
		}
	case errors.Is(err, context.Canceled):
		// The client went away (or the gateway is stopping); nobody reads
		// this body, but logs and metrics see the nginx-style 499.
		return &apiError{
			status:  statusClientClosed,
			message: "The request was cancelled.",
			typ:     typeServer,
			code:    "cancelled",
		}
	default:
		return &apiError{
			status:  http.StatusInternalServerError,
			message: "The gateway failed to process the request.",
			typ:     typeServer,
			code:    "internal_error",
		}
	}
}

// statusClientClosed is recorded when the client disconnected first.
const statusClientClosed = 499

// errorBody is the OpenAI error envelope.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) body() []byte {
	d := errorDetail{Message: e.message, Type: e.typ}
	if e.param != "" {
		d.Param = &e.param
	}
	if e.code != "" {
		d.Code = &e.code
	}
	b, err := json.Marshal(errorBody{Error: d})
	if err != nil {
		// Marshalling strings cannot fail.
		panic(err)
	}
	return b
}

// write sends the error as a complete JSON response.
func (e *apiError) write(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.retryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((e.retryAfter+time.Second-1)/time.Second), 10))
	}
	if e.final {
		h.Set("X-Should-Retry", "false")
	}
	status := e.status
	if status == statusClientClosed {
		// Not a real HTTP status; the client is gone anyway.
		status = http.StatusServiceUnavailable
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(e.body(), '\n'))
}

// sseEvent is the error as a server-sent event, for errors that happen
// after a stream started.
func (e *apiError) sseEvent() []byte {
	b := make([]byte, 0, 256)
	b = append(b, "data: "...)
	b = append(b, e.body()...)
	return append(b, "\n\n"...)
}
