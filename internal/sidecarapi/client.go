package sidecarapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/model-orchestra/operator/internal/nodeapi"
)

// Client is the client of one engine's sidecar. Its zero Client is not
// usable: URL is required.
type Client struct {
	// URL is the sidecar's base URL, e.g. http://10.0.0.7:8090.
	URL string
	// HTTP makes the calls; nil means http.DefaultClient. The sidecar
	// bounds its own engine calls; ctx bounds the wait.
	HTTP *http.Client
	// Token is the file of the release's caller token, which the
	// sidecar's mutating endpoints require (the node agent's, internal/
	// nodeapi); empty: the calls carry none.
	Token nodeapi.TokenFile
}

// Error is a non-2xx answer of a sidecar.
type Error struct {
	Op      string
	Status  int
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("sidecar %s: answered %d: %s", e.Op, e.Status, e.Message)
}

// ErrConflict matches a 409 from a sidecar: the sleep was abandoned, the
// engine did not drain in time, or the sidecar's state does not allow the
// operation. Nothing changed on the engine.
var ErrConflict = errors.New("the sidecar refused the operation in its current state")

// Is makes errors.Is(err, ErrConflict) true for a 409.
func (e *Error) Is(target error) bool {
	return target == ErrConflict && e.Status == http.StatusConflict
}

// State is GET /state.
func (c Client) State(ctx context.Context) (Status, error) {
	var st Status
	err := c.call(ctx, http.MethodGet, "/state", "state", &st)
	return st, err
}

// Sleep is POST /sleep?level=: the sidecar drains the engine, then puts
// it to sleep at level.
func (c Client) Sleep(ctx context.Context, level int) error {
	_, err := c.SleepStatus(ctx, level)
	return err
}

// SleepStatus is Sleep, returning the sidecar's status after the sleep.
func (c Client) SleepStatus(ctx context.Context, level int) (Status, error) {
	var st Status
	err := c.call(ctx, http.MethodPost, fmt.Sprintf("/sleep?level=%d", level), "sleep", &st)
	return st, err
}

// Wake is POST /wake.
func (c Client) Wake(ctx context.Context) error {
	_, err := c.WakeStatus(ctx)
	return err
}

// WakeStatus wakes the engine and returns the sidecar's status after the
// wake: its lastWake says what the wake restored, from which tier, and its
// digest the engine's weights.
func (c Client) WakeStatus(ctx context.Context) (Status, error) {
	var st Status
	err := c.call(ctx, http.MethodPost, "/wake", "wake", &st)
	return st, err
}

// Restart is POST /restart: the asleep engine restarts in place and
// answers asleep at level 2 until its next wake.
func (c Client) Restart(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "/restart", "restart", nil)
}

func (c Client) call(ctx context.Context, method, path, op string, out any) error {
	client := c.HTTP
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	if c.Token != "" && method != http.MethodGet && method != http.MethodHead {
		tok, err := c.Token.Read()
		if err != nil {
			return fmt.Errorf("sidecar %s: %w", op, err)
		}
		nodeapi.Authorize(req, tok)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("sidecar %s: %w", op, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("sidecar %s: reading the answer: %w", op, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		return &Error{Op: op, Status: resp.StatusCode, Message: msg}
	}
	if out != nil && len(strings.TrimSpace(string(b))) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("sidecar %s: decoding the answer: %w", op, err)
		}
	}
	return nil
}
