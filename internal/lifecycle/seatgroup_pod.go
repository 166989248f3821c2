package lifecycle

// One pod of a seat group: its sidecars (podSidecar, the seatgroup.Sidecar of one
// application in the pod), its executor's dispatcher (podDispatcher) and its
// gates, from which the leader writes the SeatServingAnnotation.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/model-orchestra/operator/internal/nodeapi"
	"github.com/model-orchestra/operator/internal/seatgroup"
	"github.com/model-orchestra/operator/internal/sidecarapi"
)

// podSidecar is a member's sidecar in one pod of the group, found by the
// pod's current IP. It keeps its last reading for the status and the
// pod's gate.
type podSidecar struct {
	p      *seatPodRun
	app    string
	port   int32
	client *http.Client

	mu     sync.Mutex
	seat   sidecarapi.Status // the last reading
	seatOK bool
}

// pod returns the sidecar's pod, or an error when it does not serve (gone,
// no address, terminating).
func (s *podSidecar) pod() (*corev1.Pod, error) {
	pod, err := s.p.r.c.podLister.Pods(s.p.r.c.deps.Namespace).Get(s.p.name)
	if err != nil {
		return nil, fmt.Errorf("the group's pod %s: %w", s.p.name, err)
	}
	if pod.Status.PodIP == "" || pod.DeletionTimestamp != nil {
		return nil, fmt.Errorf("the group's pod %s has no address", s.p.name)
	}
	return pod, nil
}

func (s *podSidecar) http() (sidecarapi.Client, error) {
	pod, err := s.pod()
	if err != nil {
		return sidecarapi.Client{}, err
	}
	return sidecarapi.Client{URL: fmt.Sprintf("http://%s:%d", pod.Status.PodIP, s.port), HTTP: s.client, Token: nodeapi.TokenFile(s.p.r.c.cfg.AgentTokenFile)}, nil
}

func (s *podSidecar) reading() (sidecarapi.Status, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seat, s.seatOK
}

func (s *podSidecar) setReading(st sidecarapi.Status, ok bool) {
	s.mu.Lock()
	s.seat, s.seatOK = st, ok
	s.mu.Unlock()
}

// State implements seatgroup.Sidecar; it keeps the reading for the status.
func (s *podSidecar) State(ctx context.Context) (sidecarapi.Status, error) {
	h, err := s.http()
	var st sidecarapi.Status
	if err == nil {
		st, err = h.State(ctx)
	}
	s.setReading(st, err == nil)
	return st, err
}

// Sleep implements seatgroup.Sidecar; once the engine sleeps, its pod's gate
// closes (the consumer may open again for the other pods).
func (s *podSidecar) Sleep(ctx context.Context, level int) error {
	h, err := s.http()
	if err != nil {
		return err
	}
	if err := h.Sleep(ctx, level); err != nil {
		return err
	}
	s.asleep()
	return nil
}

// asleep records that the engine sleeps and closes its pod's gate.
func (s *podSidecar) asleep() {
	st, _ := s.reading()
	st.State = sidecarapi.Asleep
	s.setReading(st, true)
	s.p.setGate(s.app, false)
}

// ReadMemory implements seatgroup.MemoryReader.
func (s *podSidecar) ReadMemory(ctx context.Context) (seatgroup.MemoryReading, error) {
	st, err := s.State(ctx)
	if err != nil {
		return seatgroup.MemoryReading{}, err
	}
	return seatgroup.ReadingOf(st)
}

// Restart implements seatgroup.Restarter.
func (s *podSidecar) Restart(ctx context.Context) error {
	h, err := s.http()
	if err != nil {
		return err
	}
	if err := h.Restart(ctx); err != nil {
		return err
	}
	s.asleep()
	return nil
}

// Wake implements seatgroup.Sidecar; it keeps the sidecar's answer, whose
// lastWake and digest the swap's report to the node agent reads
// (reportSwap). An answer without the digest (the engine did not report
// its weights in time) keeps the one of the last reading: the digest is
// the one recorded at load.
func (s *podSidecar) Wake(ctx context.Context) error {
	h, err := s.http()
	if err != nil {
		return err
	}
	st, err := h.WakeStatus(ctx)
	if err != nil {
		return err
	}
	if prev, _ := s.reading(); st.Digest == "" {
		st.Digest = prev.Digest
	}
	s.setReading(st, true)
	return nil
}

// podDispatcher implements seatgroup.Dispatcher for one pod's executor:
// its gates are the pod's, its demand the application's (seatPodDemand).
type podDispatcher struct{ p *seatPodRun }

// Demand implements seatgroup.Dispatcher.
func (d *podDispatcher) Demand(app string) seatgroup.Demand {
	r := d.p.r
	dm := r.disp.Demand(app)
	return seatPodDemand(dm, r.servedElsewhere(d.p, app), seatgroup.DefaultMaxSwapWait)
}

// Hold implements seatgroup.Dispatcher: the pod stops serving app.
func (d *podDispatcher) Hold(app string) { d.p.setGate(app, false) }

// Release implements seatgroup.Dispatcher: the pod serves app.
func (d *podDispatcher) Release(app string) { d.p.setGate(app, true) }

// seatPodDemand is an application's demand as one pod's executor sees it:
// its queue counts only while no other pod serves the application
// (servedElsewhere false), or once its oldest request waited maxSwapWait
// (the other pods do not keep up), so that pods do not all swap the same
// application in. What is in flight always counts, wherever it runs: the
// consumer does not tell pods apart, and no engine sleeps on a guess.
func seatPodDemand(dm seatgroup.Demand, servedElsewhere bool, maxSwapWait time.Duration) seatgroup.Demand {
	if servedElsewhere && dm.OldestWait < maxSwapWait {
		dm.Queued, dm.OldestWait = 0, 0
	}
	return dm
}

// servedElsewhere reports whether a pod other than p serves app.
func (r *seatGroupRun) servedElsewhere(p *seatPodRun, app string) bool {
	for _, q := range r.pods {
		if q != p && q.gates[app] == GateOpen {
			return true
		}
	}
	return false
}

// setGate sets the pod's gate for app (nextPodGate), then the group's
// SeatServingAnnotation and the application's consumer (seatConsumerOpen).
func (p *seatPodRun) setGate(app string, open bool) {
	st, ok := p.sidecars[app].reading()
	pod, err := p.sidecars[app].pod()
	gone := err != nil || !RootServes(pod)
	p.gates[app] = nextPodGate(p.gates[app], open, ok && st.State == sidecarapi.Asleep, gone)
	p.r.applyGates(app)
}

// applyGates writes the SeatServingAnnotation the pods' gates make, when it
// changed, then opens or closes app's consumer. A draining pod stays in the
// annotation, so that the requests dispatchers already hold reach its
// engine, which is still awake; the paused consumer hands out nothing new.
// A pod leaves the annotation once its engine sleeps, and the leader waits
// for its own cache to show that (servingFence) before the consumer
// resumes for the other pods. While the annotation cannot be written, the
// consumer stays closed for every application whose written pods no
// longer all serve it.
func (r *seatGroupRun) applyGates(app string) {
	want := SeatServing{}
	for _, p := range r.pods {
		for a, g := range p.gates {
			if g == GateOpen || g == GateDraining {
				want[p.name] = append(want[p.name], a)
			}
		}
	}
	if want.String() != r.written.String() {
		removed := false
		for pod := range r.written {
			for _, a := range r.written[pod] {
				removed = removed || !want.Serves(pod, a)
			}
		}
		if err := r.writeServing(want); err != nil {
			r.c.log.Warn("seat group: writing where applications are served; retrying", "seatGroup", r.g.Name, "err", err)
		} else {
			r.written = want
			if removed {
				r.awaitServing(want)
			}
		}
	}
	gates := map[string]Gate{}
	for _, p := range r.pods {
		gates[p.name] = p.gates[app]
	}
	if seatConsumerOpen(r.written.Pods(app), gates) {
		r.disp.Release(app)
	} else {
		r.disp.Hold(app)
	}
}

// writeServing patches the group StatefulSet's SeatServingAnnotation.
func (r *seatGroupRun) writeServing(s SeatServing) error {
	ann, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{SeatServingAnnotation: s.String()}}})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.disp.ctx, 10*time.Second)
	defer cancel()
	_, err = r.c.deps.Kube.AppsV1().StatefulSets(r.c.deps.Namespace).Patch(ctx, r.g.StatefulSet, types.MergePatchType, ann,
		metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		return fmt.Errorf("annotating StatefulSet %s: %w", r.g.StatefulSet, err)
	}
	return nil
}

// awaitServing waits, at most servingFence, until the leader's cache of the
// group's StatefulSet shows s.
func (r *seatGroupRun) awaitServing(s SeatServing) {
	want := s.String()
	deadline := time.Now().Add(servingFence)
	for time.Now().Before(deadline) && r.disp.ctx.Err() == nil {
		sts, err := r.c.stsLister.StatefulSets(r.c.deps.Namespace).Get(r.g.StatefulSet)
		if err == nil && ParseSeatServing(sts.Annotations[SeatServingAnnotation]).String() == want {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.c.log.Warn("seat group: the StatefulSet's cache did not show where applications are served in time", "seatGroup", r.g.Name, "within", servingFence)
}
