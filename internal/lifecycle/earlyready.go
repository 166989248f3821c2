package lifecycle

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Early readiness. A starting root can serve the moment its engine
// answers, but the kubelet says so only at its next probe: up to a probe
// period later (a root's startup probe asks every second, and the
// readiness probe runs right after it passes; a worker's asks every 10
// s). While a root or worker pod of an application with a lifecycle runs
// but is not Ready, every dispatcher
// runs the pod's own probes itself, the way the kubelet would: the
// startup probe of each container that has not started, then the
// readiness probe of each container. It asks every 2% of the time since
// the containers started (10 ms to 500 ms, so a long model load costs few
// requests), and counts the pod as serving from the first time all of
// them pass until the kubelet agrees; from then on the kubelet's word
// alone counts. Only the probes a dispatcher can run from outside the pod
// count (httpGet and tcpSocket): a pod with an exec or gRPC probe, or with
// readiness gates, waits for the kubelet. A container that restarts after
// the answer, or a kubelet that has not agreed within earlyReadyGrace,
// ends the early answer. A pod that was Ready once since its containers
// started is probed early again only after the leader woke its engine from
// sleep (woken.go): its sidecar failed its readiness while the engine
// slept, and the kubelet would say it serves again only at the sidecar's
// next readiness probe, up to a probe period after the wake.

const (
	earlyProbeMin  = 10 * time.Millisecond
	earlyProbeMax  = 500 * time.Millisecond
	earlyProbeFrac = 50 // the period is the time since the start / earlyProbeFrac
	// earlyProbeTimeout bounds one probe (the probe's own timeout, when
	// shorter).
	earlyProbeTimeout = time.Second
	// earlyReadyGrace is how long an early answer stands without the
	// kubelet marking the pod Ready: its startup and readiness probes'
	// periods and more.
	earlyReadyGrace = 15 * time.Second
)

// probeCheck is one probe to run against a pod from outside it.
type probeCheck struct {
	// url is set for an HTTP GET; addr (host:port) for a TCP connect.
	url     string
	addr    string
	header  http.Header
	timeout time.Duration
}

// earlyChecks returns the probes that say a pod serves: each container's
// startup probe while it has not started, and its readiness probe. An
// error says why the pod cannot be probed from outside (the kubelet
// decides alone).
func earlyChecks(p *corev1.Pod) ([]probeCheck, error) {
	if len(p.Spec.ReadinessGates) > 0 {
		return nil, errors.New("the pod has readiness gates")
	}
	if p.Status.PodIP == "" {
		return nil, errors.New("the pod has no IP")
	}
	started := map[string]bool{}
	for _, s := range p.Status.ContainerStatuses {
		started[s.Name] = s.Started != nil && *s.Started
	}
	var out []probeCheck
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		for _, pr := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe} {
			if pr == nil || (pr == c.StartupProbe && started[c.Name]) {
				continue
			}
			ck, err := probeCheckFor(p.Status.PodIP, c, pr)
			if err != nil {
				return nil, fmt.Errorf("container %s: %w", c.Name, err)
			}
			out = append(out, ck)
		}
	}
	return out, nil
}

// probeCheckFor translates one probe of container c of the pod at ip.
func probeCheckFor(ip string, c *corev1.Container, pr *corev1.Probe) (probeCheck, error) {
	ck := probeCheck{timeout: earlyProbeTimeout}
	if t := time.Duration(pr.TimeoutSeconds) * time.Second; t > 0 && t < ck.timeout {
		ck.timeout = t
	}
	switch {
	case pr.HTTPGet != nil:
		g := pr.HTTPGet
		port, err := containerPort(c, g.Port)
		if err != nil {
			return ck, err
		}
		host := ip
		if g.Host != "" {
			host = g.Host
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		path := g.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		ck.url = scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + path
		ck.header = http.Header{}
		for _, h := range g.HTTPHeaders {
			ck.header.Add(h.Name, h.Value)
		}
	case pr.TCPSocket != nil:
		port, err := containerPort(c, pr.TCPSocket.Port)
		if err != nil {
			return ck, err
		}
		host := ip
		if pr.TCPSocket.Host != "" {
			host = pr.TCPSocket.Host
		}
		ck.addr = net.JoinHostPort(host, strconv.Itoa(port))
	case pr.Exec != nil:
		return ck, errors.New("an exec probe runs only in the pod")
	case pr.GRPC != nil:
		return ck, errors.New("a gRPC probe is left to the kubelet")
	default:
		return ck, errors.New("a probe without a handler")
	}
	return ck, nil
}

// containerPort resolves a probe's port: a number, or the name of one of
// the container's ports.
func containerPort(c *corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, cp := range c.Ports {
		if cp.Name == port.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("no port named %q", port.StrVal)
}

// earlyProbeable reports whether the kubelet may not have said yet what
// the pod's probes would say now: it is not terminating, every container
// runs, and it has not been Ready since they started, or, when the leader
// woke its engine from sleep at woken (zero: not lately), since then. A
// pod that was Ready and is not any more (a failing readiness probe, a
// sleeping engine's sidecar) is otherwise the kubelet's alone.
func earlyProbeable(p *corev1.Pod, woken time.Time) bool {
	if p.DeletionTimestamp != nil || !allRunning(p) {
		return false
	}
	since := probedSince(p, woken)
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status != corev1.ConditionTrue && !c.LastTransitionTime.After(since)
		}
	}
	return true
}

// probedSince is when the pod's probes began to count: when its
// containers started running, or when the leader woke its engine (woken),
// whichever is later.
func probedSince(p *corev1.Pod, woken time.Time) time.Time {
	since := runningSince(p)
	if woken.After(since) {
		return woken
	}
	return since
}

func allRunning(p *corev1.Pod) bool {
	if len(p.Status.ContainerStatuses) < len(p.Spec.Containers) {
		return false
	}
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Running == nil {
			return false
		}
	}
	return true
}

// restarts sums the restart counts of the pod's containers.
func restarts(p *corev1.Pod) int32 {
	var n int32
	for _, s := range p.Status.ContainerStatuses {
		n += s.RestartCount
	}
	return n
}

// runningSince is when the last of the pod's containers started running
// (zero when unknown).
func runningSince(p *corev1.Pod) time.Time {
	var t time.Time
	for _, s := range p.Status.ContainerStatuses {
		if r := s.State.Running; r != nil && r.StartedAt.After(t) {
			t = r.StartedAt.Time
		}
	}
	return t
}

// earlyProbePeriod is the wait between two probes of a pod whose
// containers have run for since.
func earlyProbePeriod(since time.Duration) time.Duration {
	return min(max(since/earlyProbeFrac, earlyProbeMin), earlyProbeMax)
}

// earlyAnswer is a pod's probes all passing.
type earlyAnswer struct {
	restarts int32
	at       time.Time
}

// stands reports whether the answer still makes p serve at now (woken as
// for earlyProbeable).
func (a earlyAnswer) stands(p *corev1.Pod, now, woken time.Time) bool {
	return earlyProbeable(p, woken) && restarts(p) == a.restarts && now.Sub(a.at) < earlyReadyGrace
}

// earlyReady runs the probes of the starting root and worker pods it is
// shown and remembers which answered.
type earlyReady struct {
	log    *slog.Logger
	now    func() time.Time
	client *http.Client
	dialer net.Dialer
	// answered is called, from a probing goroutine, when a pod's probes
	// all passed.
	answered func(p *corev1.Pod)

	mu      sync.Mutex
	ctx     context.Context
	probing map[types.UID]probing
	answers map[types.UID]earlyAnswer
	// woken is when the leader said a pod's engine woke from sleep
	// (wokeUp); it counts for earlyReadyGrace.
	woken map[types.UID]time.Time
}

type probing struct {
	restarts int32
	ip       string
	// ctx ends when the probing stops: cancelled, or, for a woken pod,
	// at the end of the wake's grace.
	ctx    context.Context
	cancel context.CancelFunc
}

func newEarlyReady(log *slog.Logger, now func() time.Time, answered func(*corev1.Pod)) *earlyReady {
	tr := &http.Transport{
		// The kubelet does not verify an HTTPS probe's certificate.
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // as the kubelet's probes
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     10 * time.Second,
	}
	return &earlyReady{
		log: log, now: now, answered: answered,
		client: &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		probing: map[types.UID]probing{},
		answers: map[types.UID]earlyAnswer{},
		woken:   map[types.UID]time.Time{},
	}
}

// start lets track start probes until ctx ends.
func (e *earlyReady) start(ctx context.Context) {
	e.mu.Lock()
	e.ctx = ctx
	e.mu.Unlock()
}

// serves reports whether p serves by an early answer.
func (e *earlyReady) serves(p *corev1.Pod) bool {
	return e != nil && !e.answeredAt(p).IsZero()
}

// answeredAt is when p's probes all passed, while that answer stands;
// zero otherwise.
func (e *earlyReady) answeredAt(p *corev1.Pod) time.Time {
	now := e.now()
	e.mu.Lock()
	a, ok := e.answers[p.UID]
	woken := e.wokenAt(p, now)
	e.mu.Unlock()
	if !ok || !a.stands(p, now, woken) {
		return time.Time{}
	}
	return a.at
}

// wokenAt is when the leader last said p's engine woke from sleep, within
// earlyReadyGrace of now; zero otherwise. e.mu is held.
func (e *earlyReady) wokenAt(p *corev1.Pod, now time.Time) time.Time {
	w, ok := e.woken[p.UID]
	if !ok || now.Sub(w) >= earlyReadyGrace {
		return time.Time{}
	}
	return w
}

// wokeUp tells that the leader woke the engine of root pod p from sleep at
// at: p, which turned unready while its engine slept, is probed again,
// and serves once its probes pass, before the kubelet's next probe says
// so.
func (e *earlyReady) wokeUp(p *corev1.Pod, at time.Time) {
	e.mu.Lock()
	e.woken[p.UID] = at
	e.mu.Unlock()
	e.track(p, false)
}

// track looks at a root or worker pod's new state (gone: deleted): it starts
// probing a pod that runs and is not Ready, and stops, and forgets its
// answer, once the kubelet has spoken or the pod changed.
func (e *earlyReady) track(p *corev1.Pod, gone bool) {
	now := e.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	cur, probingNow := e.probing[p.UID]
	stop := func() {
		if probingNow {
			cur.cancel()
			delete(e.probing, p.UID)
		}
	}
	woken := e.wokenAt(p, now)
	if woken.IsZero() {
		delete(e.woken, p.UID)
	}
	if gone || !earlyProbeable(p, woken) {
		stop()
		delete(e.answers, p.UID)
		delete(e.woken, p.UID)
		return
	}
	if a, ok := e.answers[p.UID]; ok {
		if a.restarts == restarts(p) {
			return // answered; the kubelet has not spoken yet
		}
		delete(e.answers, p.UID) // restarted since: probe again
	}
	if probingNow && cur.restarts == restarts(p) && cur.ip == p.Status.PodIP && cur.ctx.Err() == nil {
		return
	}
	stop()
	if e.ctx == nil {
		return
	}
	checks, err := earlyChecks(p)
	if err != nil {
		e.log.Debug("pod left to the kubelet's probes", "pod", p.Name, "reason", err)
		return
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if !woken.IsZero() && !earlyProbeable(p, time.Time{}) {
		// Probed for the wake alone: no longer than the wake counts.
		ctx, cancel = context.WithDeadline(e.ctx, woken.Add(earlyReadyGrace))
	} else {
		ctx, cancel = context.WithCancel(e.ctx)
	}
	e.probing[p.UID] = probing{restarts: restarts(p), ip: p.Status.PodIP, ctx: ctx, cancel: cancel}
	go e.probe(ctx, p, checks, woken)
}

// probe runs checks until they all pass at once or ctx ends; woken is when
// the pod's engine woke from sleep (zero: a starting pod).
func (e *earlyReady) probe(ctx context.Context, p *corev1.Pod, checks []probeCheck, woken time.Time) {
	since := probedSince(p, woken)
	if since.IsZero() {
		since = e.now()
	}
	for !e.passes(ctx, checks) {
		t := time.NewTimer(earlyProbePeriod(e.now().Sub(since)))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	e.mu.Lock()
	if ctx.Err() != nil {
		e.mu.Unlock()
		return // the pod changed while the last probe ran
	}
	at := e.now()
	e.answers[p.UID] = earlyAnswer{restarts: restarts(p), at: at}
	if cur, ok := e.probing[p.UID]; ok {
		cur.cancel()
		delete(e.probing, p.UID)
	}
	e.mu.Unlock()
	if woken.IsZero() {
		e.log.Info("pod answers its probes before the kubelet says Ready", "pod", p.Name,
			"sinceRunning", at.Sub(since).Round(time.Millisecond))
	} else {
		e.log.Info("woken pod answers its probes before the kubelet says Ready", "pod", p.Name,
			"sinceWake", at.Sub(since).Round(time.Millisecond))
	}
	e.answered(p)
	// An answer the kubelet never confirms ends at earlyReadyGrace: tell
	// again then, so that the pod stops counting as serving.
	time.AfterFunc(earlyReadyGrace, func() {
		e.mu.Lock()
		a, ok := e.answers[p.UID]
		e.mu.Unlock()
		if ok && a.at.Equal(at) {
			e.log.Warn("pod answered its probes but the kubelet has not marked it Ready", "pod", p.Name, "after", earlyReadyGrace)
			e.answered(p)
		}
	})
}

// passes runs every check once.
func (e *earlyReady) passes(ctx context.Context, checks []probeCheck) bool {
	for _, ck := range checks {
		cctx, cancel := context.WithTimeout(ctx, ck.timeout)
		err := e.check(cctx, ck)
		cancel()
		if err != nil {
			return false
		}
	}
	return true
}

// check runs one probe: an HTTP GET answered 200–399 (the kubelet's
// rule), or a TCP connection accepted.
func (e *earlyReady) check(ctx context.Context, ck probeCheck) error {
	if ck.addr != "" {
		conn, err := e.dialer.DialContext(ctx, "tcp", ck.addr)
		if err != nil {
			return err
		}
		return conn.Close()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ck.url, nil)
	if err != nil {
		return err
	}
	for k, vs := range ck.header {
		req.Header[k] = vs
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "orchestra-dispatcher-probe")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // keeps the connection for the next probe
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return fmt.Errorf("%s answered %d", ck.url, resp.StatusCode)
	}
	return nil
}
