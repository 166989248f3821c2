package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/model-orchestra/operator/internal/lifecycle"
)

// Wake progress: the lifecycle tells every dispatcher replica the root
// pods of its applications (RootPods); the dispatcher says how far the
// furthest pod is, in a sentence, on the core NATS subject
// natsqueue.Names.WakeProgress(app), whenever that changes and every
// progressEvery, and the gateways put it in the SSE comments of requests
// waiting for the wake (internal/gateway, waking.go).

// progressEvery repeats the last progress, so that a gateway that started
// during a long model load learns it, and drops it when it is stale.
const progressEvery = 5 * time.Second

// wakeProgress keeps the last progress sentence per application.
type wakeProgress struct {
	mu   sync.Mutex
	last map[string]string
}

// podProgress describes how far the furthest of an application's root
// pods is on its way to serving; "" without pods.
func podProgress(pods []lifecycle.RootPod) string {
	best, said := -1, ""
	for _, rp := range pods {
		p := rp.Pod
		if p == nil || p.DeletionTimestamp != nil {
			continue
		}
		rank, s := podStage(p, rp.Serves)
		if rank > best {
			best, said = rank, s
		}
	}
	return said
}

// podStage ranks one pod's progress: pending (0), scheduled with init
// containers running (1), containers starting (2), the engine running and
// loading its model (3), serving (4).
func podStage(p *corev1.Pod, serves bool) (int, string) {
	if serves {
		return 4, fmt.Sprintf("pod %s is ready", p.Name)
	}
	if p.Spec.NodeName == "" {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
				return 0, fmt.Sprintf("pod %s is not scheduled yet (%s: %s)", p.Name, c.Reason, c.Message)
			}
		}
		return 0, fmt.Sprintf("pod %s is waiting to be scheduled", p.Name)
	}
	on := fmt.Sprintf("pod %s is scheduled on node %s", p.Name, p.Spec.NodeName)
	for _, c := range p.Status.InitContainerStatuses {
		if c.State.Terminated == nil || c.State.Terminated.ExitCode != 0 {
			return 1, fmt.Sprintf("%s; its init container %s prepares the model%s", on, c.Name, waitingReason(c))
		}
	}
	running := 0
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running != nil {
			running++
		} else if c.State.Waiting != nil {
			return 2, fmt.Sprintf("%s; starting container %s%s", on, c.Name, waitingReason(c))
		}
	}
	if running == 0 {
		return 2, on + "; starting its containers"
	}
	return 3, fmt.Sprintf("%s; the engine is running and loading the model", on)
}

func waitingReason(c corev1.ContainerStatus) string {
	if w := c.State.Waiting; w != nil && w.Reason != "" {
		return " (" + w.Reason + ")"
	}
	return ""
}

// sayProgress publishes app's progress when it changed.
func (d *Dispatcher) sayProgress(app string, pods []lifecycle.RootPod) {
	said := podProgress(pods)
	d.progress.mu.Lock()
	if d.progress.last == nil {
		d.progress.last = map[string]string{}
	}
	changed := d.progress.last[app] != said
	d.progress.last[app] = said
	d.progress.mu.Unlock()
	if changed && said != "" {
		_ = d.nc.Publish(d.names.WakeProgress(app), []byte(said))
	}
}

// repeatProgress publishes every application's last progress every
// progressEvery until ctx ends.
func (d *Dispatcher) repeatProgress(ctx context.Context) {
	t := time.NewTicker(progressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		d.progress.mu.Lock()
		last := make(map[string]string, len(d.progress.last))
		for app, s := range d.progress.last {
			last[app] = s
		}
		d.progress.mu.Unlock()
		for app, s := range last {
			if s != "" {
				_ = d.nc.Publish(d.names.WakeProgress(app), []byte(s))
			}
		}
	}
}
