package batch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Run drives every batch that is not done until ctx ends: each tick (and
// each Kick) takes every active batch one step further. The active batches
// come from a watch of their keys, so that a gateway with none sends
// nothing to NATS: listing the keys every tick cost about 20 messages a
// second per gateway.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.Interval)
	defer t.Stop()
	active := map[string]string{} // batch id -> owner
	var w jetstream.KeyWatcher
	defer func() {
		if w != nil {
			_ = w.Stop()
		}
	}()
	for ctx.Err() == nil {
		var updates <-chan jetstream.KeyValueEntry
		if w == nil {
			var err error
			if w, err = s.store.watchActive(ctx); err != nil {
				s.log.Debug("watching the active batches; trying again", "err", err)
				w = nil
			} else {
				// The watch starts with every active batch.
				clear(active)
			}
		}
		if w != nil {
			updates = w.Updates()
		}
		select {
		case <-ctx.Done():
			return
		case e, ok := <-updates:
			switch {
			case !ok:
				_ = w.Stop()
				w = nil
			case e == nil:
				// The end of the initial values.
			case e.Operation() == jetstream.KeyValuePut:
				id := strings.TrimPrefix(e.Key(), "a.")
				active[id] = string(e.Value())
				s.tick(ctx, map[string]string{id: string(e.Value())})
			default:
				delete(active, strings.TrimPrefix(e.Key(), "a."))
			}
		case <-t.C:
			s.tick(ctx, active)
		case <-s.kick:
			s.tick(ctx, active)
		}
	}
}

// tick takes every batch of active (id -> owner) one step further.
func (s *Service) tick(ctx context.Context, active map[string]string) {
	for id, owner := range active {
		if err := s.advance(ctx, owner, id); err != nil && !errors.Is(err, errConflict) && ctx.Err() == nil {
			s.log.Warn("driving batch", "batch", id, "err", err)
		}
	}
}

// advance takes one batch one step further. Every step can be repeated:
// lines are published with their batch and line as message id, results
// are written once, result files have ids derived from the batch.
func (s *Service) advance(ctx context.Context, owner, id string) error {
	r, rev, err := s.store.getRecord(ctx, owner, id)
	if errors.Is(err, ErrNotFound) {
		// The active key is written before the record (createRecord): a
		// young key may belong to a record still being written.
		return s.store.deactivateOrphan(ctx, id, s.now())
	}
	if err != nil {
		return err
	}
	now := s.now()
	expired := r.Batch.ExpiresAt != nil && now.Unix() >= *r.Batch.ExpiresAt
	switch st := r.Batch.Status; {
	case Terminal(st):
		return s.store.deactivate(ctx, id)
	case st == StatusCancelling:
		return s.finishEarly(ctx, r, rev, StatusCancelled, CodeCancelled, "The batch was cancelled before this request ran.")
	case (st == StatusValidating || st == StatusInProgress) && expired:
		return s.finishEarly(ctx, r, rev, StatusExpired, CodeExpired, "This request could not be executed before the completion window expired.")
	case st == StatusValidating:
		return s.publish(ctx, r, rev)
	case st == StatusInProgress:
		done, failed, err := s.store.countResults(ctx, id)
		if err != nil {
			return err
		}
		counts := RequestCounts{Total: r.Batch.RequestCounts.Total, Completed: done - failed, Failed: failed}
		if done >= counts.Total {
			t := now.Unix()
			r.Batch.Status, r.Batch.FinalizingAt = StatusFinalizing, &t
		} else if counts == r.Batch.RequestCounts {
			return nil
		}
		r.Batch.RequestCounts = counts
		if _, err := s.store.updateRecord(ctx, r, rev); err != nil {
			return err
		}
		if r.Batch.Status == StatusFinalizing {
			s.m.batches.WithLabelValues(StatusFinalizing).Inc()
			s.Kick()
		}
		return nil
	case st == StatusFinalizing:
		if err := s.writeFiles(ctx, &r); err != nil {
			return err
		}
		t := now.Unix()
		r.Batch.Status, r.Batch.CompletedAt = StatusCompleted, &t
		return s.finish(ctx, r, rev)
	}
	return nil
}

// publish puts the batch's lines on the batch stream, then moves it to
// in_progress. A batch whose input file is gone fails.
func (s *Service) publish(ctx context.Context, r record, rev uint64) error {
	data, err := s.store.FileContent(ctx, r.Owner, r.Batch.InputFileID)
	if errors.Is(err, ErrNotFound) {
		t := s.now().Unix()
		r.Batch.Status, r.Batch.FailedAt = StatusFailed, &t
		r.Batch.Errors = &Errors{Object: "list", Data: []LineError{{Code: "file_not_found",
			Message: fmt.Sprintf("The input file %s was deleted before the batch started.", r.Batch.InputFileID)}}}
		return s.finish(ctx, r, rev)
	}
	if err != nil {
		return err
	}
	lines, err := ParseInput(data, 1<<30, nil)
	if err != nil {
		return err
	}
	subject := s.names.BatchLines(r.App, r.Batch.ID)
	for i, l := range lines {
		h := nats.Header{}
		h.Set(natsqueue.HeaderBatch, r.Batch.ID)
		h.Set(natsqueue.HeaderLine, strconv.Itoa(i))
		h.Set(natsqueue.HeaderPath, l.URL)
		h.Set(natsqueue.HeaderCustomID, l.CustomID)
		msg := &nats.Msg{Subject: subject, Header: h, Data: l.Body}
		if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(r.Batch.ID+"."+strconv.Itoa(i)),
			jetstream.WithExpectStream(s.names.BatchStream())); err != nil {
			return fmt.Errorf("publishing line %d: %w", i, err)
		}
	}
	t := s.now().Unix()
	r.Batch.Status, r.Batch.InProgressAt = StatusInProgress, &t
	if _, err := s.store.updateRecord(ctx, r, rev); err != nil {
		return err
	}
	s.m.batches.WithLabelValues(StatusInProgress).Inc()
	s.m.lines.Add(float64(len(lines)))
	return nil
}

// finishEarly ends a cancelled or expired batch: its waiting lines are
// removed, every line without a result gets the error code, and the files
// are written from the results.
func (s *Service) finishEarly(ctx context.Context, r record, rev uint64, status, code, message string) error {
	st, err := s.js.Stream(ctx, s.names.BatchStream())
	if err == nil {
		err = st.Purge(ctx, jetstream.WithPurgeSubject(s.names.BatchLines(r.App, r.Batch.ID)))
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("removing waiting lines: %w", err)
	}
	data, err := s.store.FileContent(ctx, r.Owner, r.Batch.InputFileID)
	var lines []InputLine
	if err == nil {
		lines, _ = ParseInput(data, 1<<30, nil)
	}
	for i := range r.Batch.RequestCounts.Total {
		custom := ""
		if i < len(lines) {
			custom = lines[i].CustomID
		}
		out := OutputLine{ID: LineID(r.Batch.ID, i), CustomID: custom, Error: &LineErrorShort{Code: code, Message: message}}
		if _, err := WriteResult(ctx, s.store.results, r.Batch.ID, i, out); err != nil {
			return err
		}
	}
	if err := s.writeFiles(ctx, &r); err != nil {
		return err
	}
	t := s.now().Unix()
	r.Batch.Status = status
	if status == StatusCancelled {
		r.Batch.CancelledAt = &t
	} else {
		r.Batch.ExpiredAt = &t
	}
	return s.finish(ctx, r, rev)
}

// writeFiles writes the output and error files from the results (in line
// order) and sets the exact counts.
func (s *Service) writeFiles(ctx context.Context, r *record) error {
	var ok, failed bytes.Buffer
	counts := RequestCounts{Total: r.Batch.RequestCounts.Total}
	for i := range counts.Total {
		l, err := s.store.result(ctx, r.Batch.ID, i)
		if err != nil {
			return err
		}
		if l == nil {
			return fmt.Errorf("line %d has no result yet", i)
		}
		b, err := jsonLine(l)
		if err != nil {
			return err
		}
		if l.Succeeded() {
			counts.Completed++
			ok.Write(b)
		} else {
			counts.Failed++
			failed.Write(b)
		}
	}
	r.Batch.RequestCounts = counts
	for _, f := range []struct {
		kind string
		data []byte
		id   **string
	}{{"output", ok.Bytes(), &r.Batch.OutputFileID}, {"error", failed.Bytes(), &r.Batch.ErrorFileID}} {
		if len(f.data) == 0 {
			continue
		}
		id := resultFileID(r.Batch.ID, f.kind)
		file := File{ID: id, Object: "file", Bytes: int64(len(f.data)), CreatedAt: s.now().Unix(),
			Filename: r.Batch.ID + "_" + f.kind + ".jsonl", Purpose: PurposeBatchOutput, Status: "processed"}
		if err := s.store.PutFile(ctx, r.Owner, file, f.data); err != nil {
			return err
		}
		*f.id = &id
	}
	return nil
}

// finish writes a terminal record and drops the batch from the active ones.
func (s *Service) finish(ctx context.Context, r record, rev uint64) error {
	if _, err := s.store.updateRecord(ctx, r, rev); err != nil {
		return err
	}
	s.m.batches.WithLabelValues(r.Batch.Status).Inc()
	s.m.results.WithLabelValues("completed").Add(float64(r.Batch.RequestCounts.Completed))
	s.m.results.WithLabelValues("failed").Add(float64(r.Batch.RequestCounts.Failed))
	return s.store.deactivate(ctx, r.Batch.ID)
}
