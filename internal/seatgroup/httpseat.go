package seatgroup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/model-orchestra/operator/internal/checkpoint"
)

// HTTPSeat is a Seat, a MemoryReader and a Restarter over an
// orchestra-agent seat sidecar's HTTP API (checkpoint.Seat.Handler):
// GET /state, POST /sleep?level=, POST /wake, POST /restart.
type HTTPSeat struct {
	// URL is the seat agent's base URL, e.g. http://10.0.0.7:8090.
	URL string
	// Client makes the calls; nil means a client without timeout (the seat
	// bounds its own engine calls, and ctx bounds the wait).
	Client *http.Client
}

// SeatError is a non-2xx answer of a seat agent.
type SeatError struct {
	Op      string
	Status  int
	Message string
}

func (e *SeatError) Error() string {
	return fmt.Sprintf("seat %s: answered %d: %s", e.Op, e.Status, e.Message)
}

// ErrSeatConflict matches a 409 from a seat: the sleep was abandoned, the
// engine did not drain in time, or the seat's state does not allow the
// operation. Nothing changed on the engine.
var ErrSeatConflict = errors.New("the seat refused the operation in its current state")

// Is makes errors.Is(err, ErrSeatConflict) true for a 409.
func (e *SeatError) Is(target error) bool {
	return target == ErrSeatConflict && e.Status == http.StatusConflict
}

// State implements Seat.
func (s HTTPSeat) State(ctx context.Context) (checkpoint.SeatStatus, error) {
	var st checkpoint.SeatStatus
	err := s.call(ctx, http.MethodGet, "/state", "state", &st)
	return st, err
}

// Sleep implements Seat.
func (s HTTPSeat) Sleep(ctx context.Context, level int) error {
	return s.call(ctx, http.MethodPost, fmt.Sprintf("/sleep?level=%d", level), "sleep", nil)
}

// Restart implements Restarter: POST /restart restarts the asleep engine
// in place (checkpoint.Seat.Restart).
func (s HTTPSeat) Restart(ctx context.Context) error {
	return s.call(ctx, http.MethodPost, "/restart", "restart", nil)
}

// ReadMemory implements MemoryReader from GET /state: the residentBytes and
// weightsBytes the engine reports (ErrMemoryNotReported when it does not).
func (s HTTPSeat) ReadMemory(ctx context.Context) (MemoryReading, error) {
	st, err := s.State(ctx)
	if err != nil {
		return MemoryReading{}, err
	}
	return ReadingOf(st)
}

// ReadingOf is the memory reading in a seat's status.
func ReadingOf(st checkpoint.SeatStatus) (MemoryReading, error) {
	if st.WeightsError != "" {
		return MemoryReading{}, fmt.Errorf("the seat could not read the engine's memory: %s", st.WeightsError)
	}
	if st.ResidentBytes == nil {
		return MemoryReading{}, ErrMemoryNotReported
	}
	r := MemoryReading{ResidentBytes: *st.ResidentBytes}
	if st.WeightsBytes != nil {
		r.WeightsBytes = *st.WeightsBytes
	}
	return r, nil
}

// Wake implements Seat.
func (s HTTPSeat) Wake(ctx context.Context) error {
	_, err := s.WakeStatus(ctx)
	return err
}

// WakeStatus wakes the engine and returns the seat's status after the
// wake: its lastWake says what the wake restored, from which tier.
func (s HTTPSeat) WakeStatus(ctx context.Context) (checkpoint.SeatStatus, error) {
	var st checkpoint.SeatStatus
	err := s.call(ctx, http.MethodPost, "/wake", "wake", &st)
	return st, err
}

func (s HTTPSeat) call(ctx context.Context, method, path, op string, out any) error {
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(s.URL, "/")+path, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("seat %s: %w", op, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("seat %s: reading the answer: %w", op, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		return &SeatError{Op: op, Status: resp.StatusCode, Message: msg}
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("seat %s: decoding the answer: %w", op, err)
		}
	}
	return nil
}
