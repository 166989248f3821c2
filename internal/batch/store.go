package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Keys of the batches bucket: "b.<owner>.<batch id>" holds a record;
// "a.<batch id>" (value: the owner key) exists while the batch is not
// done, for the drivers. Keys of the results bucket: "r.<batch id>.<line>"
// holds the line's OutputLine, written once; "f.<batch id>.<line>" marks a
// line that failed, so that counts come from key listings.
func recordKey(owner, id string) string { return "b." + owner + "." + id }
func activeKey(id string) string        { return "a." + id }
func resultKey(id string, line int) string {
	return "r." + id + "." + strconv.Itoa(line)
}
func failedKey(id string, line int) string { return "f." + id + "." + strconv.Itoa(line) }

// record is a batch as stored.
type record struct {
	Batch Batch `json:"batch"`
	// Owner is the owner key of the token that created it.
	Owner string `json:"owner"`
	// App serves the batch's model.
	App string `json:"app"`
}

// resultsTTL is how long a line's result is kept: longer than any batch
// runs (its 24 h window and the finalization).
const resultsTTL = 7 * 24 * time.Hour

// Store keeps files, batches and results in JetStream. The buckets are
// created on first use (a gateway starting while NATS is down starts
// anyway); every later use retries that until it succeeds.
type Store struct {
	js       jetstream.JetStream
	names    natsqueue.Names
	replicas int
	// FilesMaxBytes bounds the object store (0: unbounded).
	filesMaxBytes int64

	mu      sync.Mutex
	batches jetstream.KeyValue
	results jetstream.KeyValue
	files   jetstream.ObjectStore
}

// NewStore returns the store of an orchestra.
func NewStore(js jetstream.JetStream, orchestra string, replicas int, filesMaxBytes int64) *Store {
	return &Store{js: js, names: natsqueue.Names{Orchestra: orchestra}, replicas: replicas, filesMaxBytes: filesMaxBytes}
}

func (s *Store) open(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.files != nil {
		return nil
	}
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: s.names.BatchesBucket(), Description: "Batch API batches of the orchestra",
		History: 1, Storage: jetstream.FileStorage, Replicas: s.replicas,
	})
	if err != nil {
		return fmt.Errorf("opening key-value bucket %s: %w", s.names.BatchesBucket(), err)
	}
	res, err := s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: s.names.BatchResultsBucket(), Description: "Batch API line results of the orchestra",
		History: 1, TTL: resultsTTL, Storage: jetstream.FileStorage, Replicas: s.replicas,
	})
	if err != nil {
		return fmt.Errorf("opening key-value bucket %s: %w", s.names.BatchResultsBucket(), err)
	}
	maxBytes := s.filesMaxBytes
	if maxBytes <= 0 {
		maxBytes = -1
	}
	obj, err := s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket: s.names.FilesBucket(), Description: "Files API files of the orchestra",
		Storage: jetstream.FileStorage, Replicas: s.replicas, MaxBytes: maxBytes,
	})
	if err != nil {
		return fmt.Errorf("opening object store %s: %w", s.names.FilesBucket(), err)
	}
	s.batches, s.results, s.files = kv, res, obj
	return nil
}

// ErrNotFound means no such file or batch for the token.
var ErrNotFound = errors.New("not found")

func objectName(owner, id string) string { return owner + "." + id }

// PutFile stores a file for owner.
func (s *Store) PutFile(ctx context.Context, owner string, f File, data []byte) error {
	if err := s.open(ctx); err != nil {
		return err
	}
	meta, err := json.Marshal(f)
	if err != nil {
		return err
	}
	_, err = s.files.Put(ctx, jetstream.ObjectMeta{
		Name:     objectName(owner, f.ID),
		Metadata: map[string]string{"file": string(meta)},
	}, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("storing file %s: %w", f.ID, err)
	}
	return nil
}

func fileFromInfo(info *jetstream.ObjectInfo) (File, bool) {
	var f File
	if info == nil || info.Deleted || json.Unmarshal([]byte(info.Metadata["file"]), &f) != nil {
		return File{}, false
	}
	return f, true
}

// GetFile returns owner's file id, or ErrNotFound.
func (s *Store) GetFile(ctx context.Context, owner, id string) (File, error) {
	if err := s.open(ctx); err != nil {
		return File{}, err
	}
	info, err := s.files.GetInfo(ctx, objectName(owner, id))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return File{}, ErrNotFound
	}
	if err != nil {
		return File{}, err
	}
	f, ok := fileFromInfo(info)
	if !ok {
		return File{}, ErrNotFound
	}
	return f, nil
}

// FileContent returns the content of owner's file id, or ErrNotFound.
func (s *Store) FileContent(ctx context.Context, owner, id string) ([]byte, error) {
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	b, err := s.files.GetBytes(ctx, objectName(owner, id))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return nil, ErrNotFound
	}
	return b, err
}

// ListFiles returns owner's files, newest first.
func (s *Store) ListFiles(ctx context.Context, owner string) ([]File, error) {
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	infos, err := s.files.List(ctx)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []File
	for _, info := range infos {
		if !strings.HasPrefix(info.Name, owner+".") {
			continue
		}
		if f, ok := fileFromInfo(info); ok {
			out = append(out, f)
		}
	}
	sortNewest(out, func(f File) (int64, string) { return f.CreatedAt, f.ID })
	return out, nil
}

// DeleteFile deletes owner's file id, or returns ErrNotFound.
func (s *Store) DeleteFile(ctx context.Context, owner, id string) error {
	if _, err := s.GetFile(ctx, owner, id); err != nil {
		return err
	}
	err := s.files.Delete(ctx, objectName(owner, id))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return ErrNotFound
	}
	return err
}

// getRecord returns a batch record and its revision, or ErrNotFound.
func (s *Store) getRecord(ctx context.Context, owner, id string) (record, uint64, error) {
	if err := s.open(ctx); err != nil {
		return record{}, 0, err
	}
	e, err := s.batches.Get(ctx, recordKey(owner, id))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return record{}, 0, ErrNotFound
	}
	if err != nil {
		return record{}, 0, err
	}
	var r record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return record{}, 0, fmt.Errorf("decoding batch %s: %w", id, err)
	}
	return r, e.Revision(), nil
}

// createRecord stores a new batch and marks it active.
func (s *Store) createRecord(ctx context.Context, r record) error {
	if err := s.open(ctx); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.batches.Put(ctx, activeKey(r.Batch.ID), []byte(r.Owner)); err != nil {
		return err
	}
	_, err = s.batches.Create(ctx, recordKey(r.Owner, r.Batch.ID), b)
	return err
}

// errConflict means another writer changed the record first.
var errConflict = errors.New("batch changed concurrently")

// updateRecord writes r if the record is still at revision rev.
func (s *Store) updateRecord(ctx context.Context, r record, rev uint64) (uint64, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return 0, err
	}
	n, err := s.batches.Update(ctx, recordKey(r.Owner, r.Batch.ID), b, rev)
	var apiErr *jetstream.APIError
	if errors.Is(err, jetstream.ErrKeyExists) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence) {
		return 0, errConflict
	}
	return n, err
}

// watchActive watches the keys of the batches not done: first each of
// them, then a nil entry, then every change.
func (s *Store) watchActive(ctx context.Context) (jetstream.KeyWatcher, error) {
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	return s.batches.Watch(ctx, activeKey("*"))
}

func (s *Store) deactivate(ctx context.Context, id string) error {
	return s.batches.Purge(ctx, activeKey(id))
}

// orphanAfter is how long an active key without its record is kept: a
// batch's creation writes the key first, the record right after it.
const orphanAfter = time.Minute

// deactivateOrphan removes the active key of a batch without a record once
// the key is older than orphanAfter (a creation that failed half way).
func (s *Store) deactivateOrphan(ctx context.Context, id string, now time.Time) error {
	e, err := s.batches.Get(ctx, activeKey(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil
	}
	if err != nil {
		return err
	}
	if now.Sub(e.Created()) < orphanAfter {
		return nil
	}
	return s.deactivate(ctx, id)
}

// listRecords returns owner's batches, newest first.
func (s *Store) listRecords(ctx context.Context, owner string) ([]Batch, error) {
	if err := s.open(ctx); err != nil {
		return nil, err
	}
	keys, err := keysWith(ctx, s.batches, "b."+owner+".*")
	if err != nil {
		return nil, err
	}
	var out []Batch
	for _, k := range keys {
		r, _, err := s.getRecord(ctx, owner, strings.TrimPrefix(k, "b."+owner+"."))
		if err == nil {
			out = append(out, r.Batch)
		}
	}
	sortNewest(out, func(b Batch) (int64, string) { return b.CreatedAt, b.ID })
	return out, nil
}

// keysWith lists a bucket's keys matching filter.
func keysWith(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	l, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, err
	}
	defer func() { _ = l.Stop() }()
	var keys []string
	for k := range l.Keys() {
		keys = append(keys, k)
	}
	return keys, nil
}

// countResults counts a batch's results and failed lines.
func (s *Store) countResults(ctx context.Context, id string) (done, failed int, err error) {
	d, err := keysWith(ctx, s.results, "r."+id+".*")
	if err != nil {
		return 0, 0, err
	}
	f, err := keysWith(ctx, s.results, "f."+id+".*")
	if err != nil {
		return 0, 0, err
	}
	return len(d), len(f), nil
}

// result returns a line's result, or nil.
func (s *Store) result(ctx context.Context, id string, line int) (*OutputLine, error) {
	e, err := s.results.Get(ctx, resultKey(id, line))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var l OutputLine
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return nil, fmt.Errorf("decoding result %s: %w", e.Key(), err)
	}
	return &l, nil
}

// WriteResult records a line's result unless it has one: the first write
// wins. It reports whether this write was the one kept.
func WriteResult(ctx context.Context, kv jetstream.KeyValue, batchID string, line int, out OutputLine) (bool, error) {
	b, err := json.Marshal(out)
	if err != nil {
		return false, err
	}
	_, err = kv.Create(ctx, resultKey(batchID, line), b)
	kept := err == nil
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return false, err
	}
	if !kept {
		// Written before, perhaps by an attempt that died before marking a
		// failure: mark it from the kept result.
		e, gerr := kv.Get(ctx, resultKey(batchID, line))
		if gerr != nil {
			return false, gerr
		}
		if err := json.Unmarshal(e.Value(), &out); err != nil {
			return false, err
		}
	}
	if !out.Succeeded() {
		if _, err := kv.Put(ctx, failedKey(batchID, line), nil); err != nil {
			return kept, err
		}
	}
	return kept, nil
}

// HasResult reports whether a line has its result.
func HasResult(ctx context.Context, kv jetstream.KeyValue, batchID string, line int) (bool, error) {
	_, err := kv.Get(ctx, resultKey(batchID, line))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
		return false, nil
	}
	return false, err
}

// Results binds the results bucket for a dispatcher: it never creates it
// (the gateway's store does, with its settings).
type Results struct {
	js     jetstream.JetStream
	bucket string

	mu sync.Mutex
	kv jetstream.KeyValue
}

// NewResults returns the results bucket of an orchestra, bound on first use.
func NewResults(js jetstream.JetStream, orchestra string) *Results {
	return &Results{js: js, bucket: natsqueue.Names{Orchestra: orchestra}.BatchResultsBucket()}
}

// Bucket returns the bound bucket.
func (r *Results) Bucket(ctx context.Context) (jetstream.KeyValue, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kv != nil {
		return r.kv, nil
	}
	kv, err := r.js.KeyValue(ctx, r.bucket)
	if err != nil {
		return nil, fmt.Errorf("binding key-value bucket %s: %w", r.bucket, err)
	}
	r.kv = kv
	return kv, nil
}

func sortNewest[T any](s []T, key func(T) (int64, string)) {
	slices.SortFunc(s, func(a, b T) int {
		ta, ia := key(a)
		tb, ib := key(b)
		if ta != tb {
			if ta > tb {
				return -1
			}
			return 1
		}
		return strings.Compare(ib, ia)
	})
}

// ProvisionLines creates or updates the batch stream and one durable
// consumer per application; dispatchers call it, as they provision the
// request stream. Line ids de-duplicate for dupWindow.
func ProvisionLines(ctx context.Context, js jetstream.JetStream, orchestra string, replicas int, ackWait time.Duration, apps []string) error {
	n := natsqueue.Names{Orchestra: orchestra}
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        n.BatchStream(),
		Description: "Model Orchestra batch lines of " + orchestra,
		Subjects:    []string{n.BatchLinesWildcard()},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
		Duplicates:  dupWindow,
	})
	if err != nil {
		return fmt.Errorf("provisioning stream %s: %w", n.BatchStream(), err)
	}
	for _, app := range apps {
		_, err := js.CreateOrUpdateConsumer(ctx, n.BatchStream(), jetstream.ConsumerConfig{
			Durable:       n.BatchConsumer(app),
			Description:   "batch lines of application " + app,
			FilterSubject: n.BatchLinesOf(app),
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       ackWait,
			MaxDeliver:    -1,
			DeliverPolicy: jetstream.DeliverAllPolicy,
		})
		if err != nil {
			return fmt.Errorf("provisioning consumer %s: %w", n.BatchConsumer(app), err)
		}
	}
	return nil
}

// dupWindow is how long the batch stream remembers line ids: a driver
// that publishes a batch's lines again (after a crash) within it stores
// each once; after it, the results written once still keep each line's
// answer single.
const dupWindow = 20 * time.Minute
