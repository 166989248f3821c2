package batch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Config configures a Service.
type Config struct {
	// Orchestra is the ModelOrchestra name.
	Orchestra string
	// Replicas of the buckets (1 or 3).
	Replicas int
	// FilesMaxBytes bounds all files together (0: unbounded).
	FilesMaxBytes int64
	// Interval paces the driver (default 500ms).
	Interval time.Duration
	// Now is the clock (default time.Now); tests move it to expire batches.
	Now func() time.Time
	Log *slog.Logger
	// Registry receives the metrics; nil: a private one.
	Registry prometheus.Registerer
}

// Service serves the Files and Batch APIs for the gateway and drives
// batches. Every gateway instance runs one; they coordinate through the
// store (each batch change is a compare-and-set on its record), so any of
// them may take a batch a step further, and a step repeated after a crash
// has the same outcome.
type Service struct {
	cfg   Config
	js    jetstream.JetStream
	names natsqueue.Names
	store *Store
	log   *slog.Logger
	now   func() time.Time
	kick  chan struct{}
	m     *metrics
}

// NewService returns the service of an orchestra on js.
func NewService(js jetstream.JetStream, cfg Config) *Service {
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	return &Service{
		cfg: cfg, js: js, names: natsqueue.Names{Orchestra: cfg.Orchestra},
		store: NewStore(js, cfg.Orchestra, cfg.Replicas, cfg.FilesMaxBytes),
		log:   cfg.Log, now: cfg.Now, kick: make(chan struct{}, 1), m: newMetrics(cfg.Registry),
	}
}

// CreateFile stores an uploaded file for owner (a token name).
func (s *Service) CreateFile(ctx context.Context, owner, filename, purpose string, data []byte) (File, error) {
	f := File{ID: NewFileID(), Object: "file", Bytes: int64(len(data)), CreatedAt: s.now().Unix(),
		Filename: filename, Purpose: purpose, Status: "processed"}
	if err := s.store.PutFile(ctx, OwnerKey(owner), f, data); err != nil {
		return File{}, err
	}
	s.m.files.WithLabelValues(purpose).Inc()
	s.m.fileBytes.WithLabelValues(purpose).Add(float64(len(data)))
	return f, nil
}

// GetFile returns owner's file, or ErrNotFound.
func (s *Service) GetFile(ctx context.Context, owner, id string) (File, error) {
	return s.store.GetFile(ctx, OwnerKey(owner), id)
}

// FileContent returns owner's file content, or ErrNotFound.
func (s *Service) FileContent(ctx context.Context, owner, id string) ([]byte, error) {
	return s.store.FileContent(ctx, OwnerKey(owner), id)
}

// ListFiles returns owner's files, newest first.
func (s *Service) ListFiles(ctx context.Context, owner string) ([]File, error) {
	return s.store.ListFiles(ctx, OwnerKey(owner))
}

// DeleteFile deletes owner's file, or returns ErrNotFound.
func (s *Service) DeleteFile(ctx context.Context, owner, id string) error {
	return s.store.DeleteFile(ctx, OwnerKey(owner), id)
}

// CreateParams describe a new batch; the gateway has checked the input
// file's lines against Endpoint and its models.
type CreateParams struct {
	InputFileID      string
	Endpoint         string
	CompletionWindow string
	Metadata         map[string]string
	// App serves the lines' model; Lines is the number of lines.
	App   string
	Lines int
}

// CreateBatch stores a new batch (validating) and has it driven.
func (s *Service) CreateBatch(ctx context.Context, owner string, p CreateParams) (Batch, error) {
	now := s.now().Unix()
	expires := now + int64((24 * time.Hour).Seconds())
	b := Batch{ID: NewBatchID(), Object: "batch", Endpoint: p.Endpoint, InputFileID: p.InputFileID,
		CompletionWindow: p.CompletionWindow, Status: StatusValidating, CreatedAt: now, ExpiresAt: &expires,
		RequestCounts: RequestCounts{Total: p.Lines}, Metadata: p.Metadata}
	if err := s.store.createRecord(ctx, record{Batch: b, Owner: OwnerKey(owner), App: p.App}); err != nil {
		return Batch{}, fmt.Errorf("storing batch: %w", err)
	}
	s.m.batches.WithLabelValues(StatusValidating).Inc()
	s.Kick()
	return b, nil
}

// GetBatch returns owner's batch, or ErrNotFound.
func (s *Service) GetBatch(ctx context.Context, owner, id string) (Batch, error) {
	r, _, err := s.store.getRecord(ctx, OwnerKey(owner), id)
	return r.Batch, err
}

// ListBatches returns owner's batches, newest first.
func (s *Service) ListBatches(ctx context.Context, owner string) ([]Batch, error) {
	return s.store.listRecords(ctx, OwnerKey(owner))
}

// ErrNotCancellable means the batch is already done (or being cancelled).
var ErrNotCancellable = errors.New("batch cannot be cancelled")

// CancelBatch moves owner's batch to cancelling; the driver cancels its
// remaining lines and moves it to cancelled.
func (s *Service) CancelBatch(ctx context.Context, owner, id string) (Batch, error) {
	for {
		r, rev, err := s.store.getRecord(ctx, OwnerKey(owner), id)
		if err != nil {
			return Batch{}, err
		}
		switch r.Batch.Status {
		case StatusCancelling:
			return r.Batch, nil
		case StatusValidating, StatusInProgress:
		default:
			return r.Batch, fmt.Errorf("%w: its status is %s", ErrNotCancellable, r.Batch.Status)
		}
		now := s.now().Unix()
		r.Batch.Status, r.Batch.CancellingAt = StatusCancelling, &now
		if _, err := s.store.updateRecord(ctx, r, rev); errors.Is(err, errConflict) {
			continue
		} else if err != nil {
			return Batch{}, err
		}
		s.m.batches.WithLabelValues(StatusCancelling).Inc()
		s.Kick()
		return r.Batch, nil
	}
}

// Kick makes the driver look at the batches soon.
func (s *Service) Kick() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
