package lifecycle

// What an application's step applies: its state (enter) and status
// (persist, readBucket), its subscription, the replica counts of its
// StatefulSets, and its events.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	autoscalingv1ac "k8s.io/client-go/applyconfigurations/autoscaling/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecyclestate"
)

// enter moves the application to state s.
func (c *Controller) enter(a *appState, s v1alpha1.LifecycleState, now time.Time) {
	if a.status.State != s && s == v1alpha1.LifecycleWaking {
		a.rootServingSeen.Store(0) // a root seen serving from here on is the wake's
	}
	if a.status.State != s {
		a.status.State = s
		a.status.Since = &metav1.Time{Time: now}
	}
	c.m.setState(a.Name, s)
}

// subscribe starts seeing the application's requests as they are
// published; flushed, so that none published after it returns is missed.
func (c *Controller) subscribe(a *appState) error {
	if a.sub != nil {
		return nil
	}
	sub, err := c.deps.NC.Subscribe(c.names.Request(a.Name), func(*nats.Msg) {
		a.lastRequest.Store(c.now().UnixNano())
		a.kickNow()
	})
	if err != nil {
		return fmt.Errorf("subscribing to requests of %s: %w", a.Name, err)
	}
	if err := c.deps.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribing to requests of %s: %w", a.Name, err)
	}
	a.sub = sub
	return nil
}

func (c *Controller) unsubscribe(a *appState) {
	if a.sub != nil {
		_ = a.sub.Unsubscribe()
		a.sub = nil
	}
}

// setReplicas writes the replica count of the root and worker
// StatefulSets through their scale subresource.
func (c *Controller) setReplicas(ctx context.Context, a *appState, n int32) error {
	if err := c.scale(ctx, a.RootStatefulSet, n); err != nil {
		return err
	}
	a.wrote, a.wroteAt = n, c.now()
	a.status.Replicas = n
	c.m.replicas.WithLabelValues(a.Name).Set(float64(n))
	return c.syncWorkers(ctx, a, n)
}

// syncWorkers runs WorkersPerReplica pods in the worker StatefulSet of
// each running replica and none in the others.
func (c *Controller) syncWorkers(ctx context.Context, a *appState, replicas int32) error {
	for i, name := range a.WorkerStatefulSets {
		want := int32(0)
		if int32(i) < replicas {
			want = a.WorkersPerReplica
		}
		w, err := c.stsLister.StatefulSets(c.deps.Namespace).Get(name)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if w.Spec.Replicas != nil && *w.Spec.Replicas == want {
			continue
		}
		if err := c.scale(ctx, name, want); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) scale(ctx context.Context, name string, n int32) error {
	return Scale(ctx, c.deps.Kube, c.deps.Namespace, name, n)
}

// Scale sets the replica count of a StatefulSet as the lifecycle leader
// does: a server-side apply of spec.replicas through the scale
// subresource, as field manager FieldManager, so that the field is owned by
// the lifecycle alone and no apply of the chart's manifest (which leaves it
// out) removes or resets it.
func Scale(ctx context.Context, kube kubernetes.Interface, namespace, name string, n int32) error {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := kube.AppsV1().StatefulSets(namespace).ApplyScale(sctx, name,
		autoscalingv1ac.Scale().WithSpec(autoscalingv1ac.ScaleSpec().WithReplicas(n)),
		metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("scaling StatefulSet %s to %d: %w", name, n, err)
	}
	return nil
}

// changed marks the application's status as changed in a way its step
// writes at once (writeStatus).
func (a *appState) changed() { a.dirty = true }

// afterStatus runs f once the step's status is written: what must not
// hold the status up (reports to the node agents, the ModelCheckpoint).
func (a *appState) afterStatus(f func(context.Context)) { a.after = append(a.after, f) }

// statusRecord is one application's lifecycle status and where persist
// publishes it: the bucket's key app, and the annotation on the StatefulSet
// set (AnnotationLifecycleStatus on an application's root StatefulSet, or
// the member's SeatAnnotationStatus on a seat group's shared one). An
// application's step (writeStatus) and a seat group's step
// (seatGroupRun.writeStatus) each write it once.
type statusRecord struct {
	status               v1alpha1.LifecycleStatus
	app, set, annotation string
	// written is the status last persisted, at writtenAt.
	written   string
	writtenAt time.Time
}

// writeStatus is the one write of a step: the application's status, when
// it changed (a change marked with changed at once; lastActiveTime alone
// at most once a minute), then what waited for it (afterStatus).
func (c *Controller) writeStatus(ctx context.Context, a *appState) error {
	err := c.persist(ctx, &a.statusRecord, a.dirty)
	if err == nil {
		a.dirty = false
	}
	after := a.after
	a.after = nil
	for _, f := range after {
		f(ctx)
	}
	return err
}

// persist publishes the application's state to the bucket (gateways) and
// to the root StatefulSet's annotation (the operator's status), when it
// changed; with force false a changed lastActiveTime alone is written at
// most once a minute.
func (c *Controller) persist(ctx context.Context, a *statusRecord, force bool) error {
	b, err := json.Marshal(a.status)
	if err != nil {
		return err
	}
	if string(b) == a.written {
		return nil
	}
	if !force && c.now().Sub(a.writtenAt) < time.Minute {
		return nil
	}
	var errs []error
	if kv := c.bucket(); kv != nil {
		v, err := lifecyclestate.Encode(a.status)
		if err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err = kv.Put(pctx, a.app, v)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("publishing state to bucket: %w", err))
		}
	}
	ann, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{a.annotation: string(b)}}})
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = c.deps.Kube.AppsV1().StatefulSets(c.deps.Namespace).Patch(pctx, a.set, types.MergePatchType, ann,
		metav1.PatchOptions{FieldManager: FieldManager})
	cancel()
	if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("annotating StatefulSet %s: %w", a.set, err))
	}
	if len(errs) == 0 {
		a.written, a.writtenAt = string(b), c.now()
	}
	return errors.Join(errs...)
}

// readBucket returns the state an earlier leader published.
func (c *Controller) readBucket(ctx context.Context, app string) (v1alpha1.LifecycleStatus, bool) {
	kv := c.bucket()
	if kv == nil {
		return v1alpha1.LifecycleStatus{}, false
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	e, err := kv.Get(rctx, app)
	if err != nil {
		return v1alpha1.LifecycleStatus{}, false
	}
	st, err := lifecyclestate.Decode(e.Value())
	if err != nil {
		return v1alpha1.LifecycleStatus{}, false
	}
	return st, true
}

// event records a Kubernetes event on the owner (or the root StatefulSet).
func (c *Controller) event(a *appState, typ, reason, format string, args ...any) {
	if c.rec == nil {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: a.RootStatefulSet, Namespace: c.deps.Namespace}
	if o := c.cfg.Owner; o != nil && o.Name != "" {
		ref = &corev1.ObjectReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, Namespace: c.deps.Namespace, UID: types.UID(o.UID)}
	}
	c.rec.Eventf(ref, typ, reason, format, args...)
}

// rootsConfirmed reports whether a root of roots (servingRoots) serves
// when the ones that existed at the last scale to zero (unconfirmedRoots)
// are read from the API server: a pod the scale to zero deleted is
// terminating there, whatever the cache still shows.
func (c *Controller) rootsConfirmed(ctx context.Context, a *appState, roots []*corev1.Pod) bool {
	check := unconfirmedRoots(roots, a.zeroAt)
	if len(check) < len(roots) {
		return true // a root created after the scale to zero
	}
	for _, p := range check {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		live, err := c.deps.Kube.CoreV1().Pods(p.Namespace).Get(gctx, p.Name, metav1.GetOptions{})
		cancel()
		if err == nil && live.UID == p.UID && c.podServes(live) {
			return true
		}
	}
	return false
}

func podReady(p *corev1.Pod) bool {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}
