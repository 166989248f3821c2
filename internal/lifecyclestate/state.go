// Package lifecyclestate is the lifecycle's key-value state: the
// JetStream bucket that holds each application's v1alpha1.LifecycleStatus,
// its codec, and a watcher that follows it. The lifecycle leader
// (internal/lifecycle) is its only writer; gateways and dispatchers read
// it. It is small on purpose: the gateway imports it alone, and so links
// none of the lifecycle, checkpoint, seat-group, fetch or S3 code
// (gateway_deps_test.go asserts it).
//
// Files:
//   - state.go: Bucket, Encode/Decode, States and Watch.
package lifecyclestate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// Bucket is the JetStream key-value bucket holding the lifecycle state of
// each application of an orchestra (key: the application name, value: a
// bucketValue as JSON). Only the lifecycle leader writes it.
func Bucket(orchestra string) string {
	return natsqueue.Names{Orchestra: orchestra}.Stream() + "_LIFECYCLE"
}

// bucketValue is a value of the lifecycle bucket: the application's
// v1alpha1.LifecycleStatus, and its since and lastWake.startTime to the
// nanosecond. The status's JSON times are whole seconds, too coarse for a
// dispatcher to tell a request stored just before the application turned
// Awake (one that waited for the wake) from one stored just after.
type bucketValue struct {
	v1alpha1.LifecycleStatus
	SinceNano     int64 `json:"sinceUnixNano,omitempty"`
	WakeStartNano int64 `json:"wakeStartUnixNano,omitempty"`
}

// Encode is st as a bucket value.
func Encode(st v1alpha1.LifecycleStatus) ([]byte, error) {
	v := bucketValue{LifecycleStatus: st}
	if st.Since != nil {
		v.SinceNano = st.Since.UnixNano()
	}
	if st.LastWake != nil && st.LastWake.StartTime != nil {
		v.WakeStartNano = st.LastWake.StartTime.UnixNano()
	}
	return json.Marshal(v)
}

// Decode reads a bucket value, with its times to the nanosecond when
// the writer gave them (a value of an older writer has whole seconds).
func Decode(b []byte) (v1alpha1.LifecycleStatus, error) {
	var v bucketValue
	if err := json.Unmarshal(b, &v); err != nil {
		return v1alpha1.LifecycleStatus{}, err
	}
	st := v.LifecycleStatus
	precise := func(t *metav1.Time, nano int64) *metav1.Time {
		if t == nil || nano == 0 || time.Unix(0, nano).Unix() != t.Unix() {
			return t // a value that does not name the same second is not this time
		}
		return &metav1.Time{Time: time.Unix(0, nano)}
	}
	st.Since = precise(st.Since, v.SinceNano)
	if st.LastWake != nil {
		st.LastWake.StartTime = precise(st.LastWake.StartTime, v.WakeStartNano)
	}
	return st, nil
}

// States follows the lifecycle state of every application of an orchestra
// from its bucket. Gateways use it to tell a request that waits for a wake
// from one that waits behind others. It is safe for concurrent use.
type States struct {
	mu     sync.RWMutex
	states map[string]v1alpha1.LifecycleStatus
}

// Lookup returns the last known state of app; ok is false when none is
// known (no lifecycle, or not heard of yet).
func (s *States) Lookup(app string) (v1alpha1.LifecycleStatus, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	st, ok := s.states[app]
	return st, ok
}

// Waking reports whether requests for app currently wait for its pods to
// start (any state but Awake), with the reason when a wake does not
// progress. Unknown applications are not waking.
func (s *States) Waking(app string) (bool, string) {
	st, ok := s.Lookup(app)
	if !ok || st.State == v1alpha1.LifecycleAwake || st.State == "" {
		return false, ""
	}
	return true, st.Message
}

// Serving reports whether app's lifecycle says it serves (Awake): the
// gateway's direct lane is used only then. An application not heard of
// yet does not serve: its requests take the queue, which waits for it.
func (s *States) Serving(app string) bool {
	st, ok := s.Lookup(app)
	return ok && st.State == v1alpha1.LifecycleAwake
}

func (s *States) set(app string, st v1alpha1.LifecycleStatus) {
	s.mu.Lock()
	if s.states == nil {
		s.states = map[string]v1alpha1.LifecycleStatus{}
	}
	s.states[app] = st
	s.mu.Unlock()
}

func (s *States) reset() {
	s.mu.Lock()
	s.states = nil
	s.mu.Unlock()
}

func (s *States) remove(app string) {
	s.mu.Lock()
	delete(s.states, app)
	s.mu.Unlock()
}

// Watch follows the orchestra's lifecycle bucket on nc until ctx
// ends. The bucket appears when a dispatcher with a lifecycle starts;
// until then (and after the connection to NATS is lost, until the watch is
// re-established) every application is unknown, that is not waking.
func Watch(ctx context.Context, nc *nats.Conn, orchestra string, log *slog.Logger) (*States, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("creating JetStream context: %w", err)
	}
	s := &States{}
	go func() {
		for delay := 250 * time.Millisecond; ctx.Err() == nil; delay = min(2*delay, 5*time.Second) {
			err := s.watch(ctx, js, orchestra)
			s.reset() // stale states could bound a wait that is not one
			if ctx.Err() != nil {
				return
			}
			if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				log.Warn("watching lifecycle states; retrying", "bucket", Bucket(orchestra), "err", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
		}
	}()
	return s, nil
}

// watch applies the bucket's updates until the watch ends.
func (s *States) watch(ctx context.Context, js jetstream.JetStream, orchestra string) error {
	kv, err := js.KeyValue(ctx, Bucket(orchestra))
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watching bucket %s: %w", Bucket(orchestra), err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch closed")
			}
			if e == nil {
				continue // initial values delivered
			}
			if e.Operation() != jetstream.KeyValuePut {
				s.remove(e.Key())
				continue
			}
			st, err := Decode(e.Value())
			if err != nil {
				continue
			}
			s.set(e.Key(), st)
		}
	}
}
