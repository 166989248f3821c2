package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/lifecyclestate"
	"github.com/model-orchestra/operator/internal/natsqueue"
)

// FieldManager is the field manager of every write of the lifecycle leader.
const FieldManager = "orchestra-lifecycle"

// Labels the chart puts on the objects of an orchestra.
const (
	labelInstance    = "app.kubernetes.io/instance"
	labelComponent   = "app.kubernetes.io/component"
	labelApplication = "modelorchestra.io/application"
)

// Deps are what the controller needs from the process it runs in.
type Deps struct {
	// NC is the dispatcher's NATS connection (owned by the caller).
	NC *nats.Conn
	// Kube reads and scales the StatefulSets, reads pods, holds the Lease
	// and records events.
	Kube kubernetes.Interface
	// Namespace of the orchestra's objects.
	Namespace string
	// Orchestra is the ModelOrchestra's name.
	Orchestra string
	// StreamReplicas is the replica count of the orchestra's streams; the
	// lifecycle bucket gets the same.
	StreamReplicas int
	// Identity names this replica in the Lease; empty: the host name.
	Identity string
	Log      *slog.Logger
	Registry prometheus.Registerer
	// Clock is time.Now unless set (tests).
	Clock func() time.Time
	// Checkpoints writes ModelCheckpoint status for applications whose
	// engines sleep; nil: through Kube's REST client.
	Checkpoints CheckpointStatusWriter
	// RootPods, when set, is told the root pods of an application with a
	// lifecycle and whether each serves, from the cache, after every
	// change of one of its pods and when a starting one answers its
	// probes (earlyready.go), on every replica, leader or not: the
	// dispatcher takes a root the moment it serves and drops it the moment
	// it terminates, without waiting for the EndpointSlice. It must not
	// block.
	RootPods func(app string, pods []RootPod)
	// SeatPods, when set, is told the pods of the seat group of an
	// application and whether each serves it (SeatPodsFor), from the
	// cache, after every change of the group's pods or StatefulSet and
	// once the caches synced (on every replica, leader or not): the
	// dispatcher sends the application's requests only to the pods that
	// serve it. It must not block.
	SeatPods func(app string, pods []SeatPod)
}

// Controller is one dispatcher's part of the lifecycle: every replica runs
// one, and the one holding the Lease decides.
type Controller struct {
	cfg   Config
	deps  Deps
	names natsqueue.Names
	js    jetstream.JetStream
	log   *slog.Logger
	m     *metrics
	sm    *sleepMetrics
	pm    *parkMetrics
	now   func() time.Time
	apps  []*appState

	rec         record.EventRecorder
	checkpoints CheckpointStatusWriter
	stsLister   appslisters.StatefulSetLister
	podLister   corelisters.PodLister
	// seatPodsMu makes each tellSeatPods read the caches and tell what
	// it read before the next one reads (the StatefulSet and pod
	// informers call it from two goroutines): the last told is the newest.
	seatPodsMu sync.Mutex

	// early runs the probes of starting root pods (earlyready.go).
	early *earlyReady

	mu       sync.Mutex
	kv       jetstream.KeyValue
	labeller *nodeLabeller          // the node labels, while this replica leads (placement.go)
	states   *lifecyclestate.States // every replica's view of the bucket

	// leaseUse holds the gateways' reports of their leases' use, heard
	// while this replica leads (leaseuse.go).
	leaseUse leaseUses
}

// RootPod is a root pod of an application with a lifecycle, and whether it
// serves (Controller.podServes).
type RootPod struct {
	Pod    *corev1.Pod
	Serves bool
}

// New builds a controller; cfg must be valid.
func New(cfg Config, deps Deps) (*Controller, error) {
	cfg = cfg.Defaulted()
	if deps.NC == nil || deps.Kube == nil {
		return nil, errors.New("lifecycle needs a NATS connection and a Kubernetes client")
	}
	js, err := jetstream.New(deps.NC)
	if err != nil {
		return nil, fmt.Errorf("creating JetStream context: %w", err)
	}
	if deps.Log == nil {
		deps.Log = slog.New(slog.DiscardHandler)
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	if deps.Clock == nil {
		deps.Clock = time.Now
	}
	if deps.Identity == "" {
		host, _ := os.Hostname()
		deps.Identity = host + "-" + nuid.Next()
	}
	if deps.StreamReplicas == 0 {
		deps.StreamReplicas = 1
	}
	c := &Controller{
		cfg:   cfg,
		deps:  deps,
		names: natsqueue.Names{Orchestra: deps.Orchestra},
		js:    js,
		log:   deps.Log.With("component", "lifecycle"),
		m:     newMetrics(deps.Registry),
		sm:    newSleepMetrics(deps.Registry),
		pm:    newParkMetrics(deps.Registry),
		now:   deps.Clock,
	}
	c.early = newEarlyReady(c.log, c.now, c.podAnswered)
	c.checkpoints = deps.Checkpoints
	if c.checkpoints == nil {
		c.checkpoints = checkpointWriter(deps.Kube)
	}
	for _, a := range cfg.Apps {
		c.apps = append(c.apps, newAppState(a))
	}
	return c, nil
}

// Run watches the orchestra's StatefulSets and pods, contends for the
// Lease and, while holding it, decides every application's replica count,
// until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.startInformers(ctx); err != nil {
		return err
	}
	unsubscribe, err := c.subscribeWoken()
	if err != nil {
		return fmt.Errorf("subscribing to woken engines: %w", err)
	}
	defer unsubscribe()
	states, err := lifecyclestate.Watch(ctx, c.deps.NC, c.deps.Orchestra, c.log)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.states = states
	c.mu.Unlock()
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.deps.Kube.CoreV1().Events(c.deps.Namespace)})
	defer broadcaster.Shutdown()
	c.rec = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "orchestra-dispatcher"})

	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: c.deps.Namespace, Name: c.cfg.Lease},
		Client:     c.deps.Kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: c.deps.Identity},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   15 * time.Second,
			RenewDeadline:   10 * time.Second,
			RetryPeriod:     2 * time.Second,
			ReleaseOnCancel: true,
			Name:            c.cfg.Lease,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(lctx context.Context) {
					c.m.leader.Set(1)
					c.log.Info("lifecycle leader: deciding replica counts", "identity", c.deps.Identity, "apps", len(c.apps))
					c.lead(lctx)
				},
				OnStoppedLeading: func() {
					c.m.leader.Set(0)
					c.log.Info("lifecycle leadership ended", "identity", c.deps.Identity)
				},
			},
		})
		if err != nil {
			return fmt.Errorf("lifecycle leader election: %w", err)
		}
		le.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}

// startInformers watches the orchestra's StatefulSets and engine pods; a
// change kicks the application it belongs to.
func (c *Controller) startInformers(ctx context.Context) error {
	sel := labels.SelectorFromSet(labels.Set{labelInstance: c.deps.Orchestra}).String()
	factory := informers.NewSharedInformerFactoryWithOptions(c.deps.Kube, 0,
		informers.WithNamespace(c.deps.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = sel }))
	sts := factory.Apps().V1().StatefulSets()
	pods := factory.Core().V1().Pods()
	c.stsLister, c.podLister = sts.Lister(), pods.Lister()
	kick := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		m, ok := obj.(metav1.Object)
		if !ok {
			return
		}
		if a := c.app(m.GetLabels()[labelApplication]); a != nil {
			a.kickNow()
		}
	}
	stsChanged := func(obj any) {
		kick(obj)
		c.seatGroupChanged(obj)
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: stsChanged, UpdateFunc: func(_, o any) { stsChanged(o) }, DeleteFunc: stsChanged}
	if _, err := sts.Informer().AddEventHandler(h); err != nil {
		return fmt.Errorf("watching StatefulSets: %w", err)
	}
	podChanged := func(obj any, gone bool) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if p, ok := obj.(*corev1.Pod); ok && c.app(p.Labels[labelApplication]) != nil {
			switch p.Labels[labelComponent] {
			case "root":
				c.early.track(p, gone)
				c.rootChanged(p)
				return
			case "worker":
				c.early.track(p, gone)
			}
		}
		kick(obj)
		c.seatGroupChanged(obj)
	}
	ph := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { podChanged(o, false) },
		UpdateFunc: func(_, o any) { podChanged(o, false) },
		DeleteFunc: func(o any) { podChanged(o, true) },
	}
	if _, err := pods.Informer().AddEventHandler(ph); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	c.early.start(ctx)
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("syncing %v informer: %w", typ, ctx.Err())
		}
	}
	for _, g := range c.cfg.SeatGroups {
		c.tellSeatPods(g)
	}
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	return nil
}

// seatGroupChanged tells SeatPods about the group of a seat group's pod or
// StatefulSet that changed.
func (c *Controller) seatGroupChanged(obj any) {
	if c.deps.SeatPods == nil {
		return
	}
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, ok := obj.(metav1.Object)
	if !ok || m.GetLabels()[labelComponent] != "seat-group" {
		return
	}
	for _, g := range c.cfg.SeatGroups {
		if g.Name == m.GetLabels()[labelSeatGroup] {
			c.tellSeatPods(g)
		}
	}
}

// tellSeatPods tells SeatPods, for each member of g, the group's pods and
// whether each serves it.
func (c *Controller) tellSeatPods(g SeatGroup) {
	if c.deps.SeatPods == nil {
		return
	}
	c.seatPodsMu.Lock()
	defer c.seatPodsMu.Unlock()
	set, err := c.stsLister.StatefulSets(c.deps.Namespace).Get(g.StatefulSet)
	if err != nil {
		set = nil
	}
	pods, err := c.podLister.Pods(c.deps.Namespace).List(labels.SelectorFromSet(labels.Set{
		labelInstance: c.deps.Orchestra, labelComponent: "seat-group", labelSeatGroup: g.Name,
	}))
	if err != nil {
		pods = nil
	}
	for _, m := range g.Members {
		c.deps.SeatPods(m.Name, SeatPodsFor(set, pods, m.Name))
	}
}

func (c *Controller) app(name string) *appState {
	for _, a := range c.apps {
		if a.Name == name {
			return a
		}
	}
	return nil
}

// lead decides for every application until ctx ends (leadership lost).
func (c *Controller) lead(ctx context.Context) {
	if err := c.ensureBucket(ctx); err != nil {
		return // ctx ended
	}
	if stop, err := c.subscribeFirstTokens(); err != nil {
		c.log.Warn("subscribing to the first tokens of wakes; lastWake.firstTokenSeconds stays empty", "err", err)
	} else {
		defer stop()
	}
	if stop, err := c.subscribeLeaseUse(); err != nil {
		c.log.Warn("subscribing to the gateways' lease use reports; every held lease counts as busy", "err", err)
	} else {
		defer stop()
	}
	var wg sync.WaitGroup
	for _, a := range c.apps {
		wg.Go(func() { c.runApp(ctx, a) })
	}
	if len(c.cfg.SeatGroups) > 0 {
		wg.Go(func() { c.runSeatGroups(ctx) })
	}
	wg.Go(func() { c.runNodeLabels(ctx) })
	wg.Wait()
}

// ensureBucket creates the lifecycle bucket, retrying until it works or ctx
// ends.
func (c *Controller) ensureBucket(ctx context.Context) error {
	for delay := 100 * time.Millisecond; ; delay = min(2*delay, 2*time.Second) {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		kv, err := c.js.CreateOrUpdateKeyValue(bctx, jetstream.KeyValueConfig{
			Bucket:      lifecyclestate.Bucket(c.deps.Orchestra),
			Description: "Model Orchestra lifecycle state of each application of " + c.deps.Orchestra,
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    c.deps.StreamReplicas,
		})
		cancel()
		if err == nil {
			c.mu.Lock()
			c.kv = kv
			c.mu.Unlock()
			return nil
		}
		c.log.Warn("creating the lifecycle bucket; retrying", "bucket", lifecyclestate.Bucket(c.deps.Orchestra), "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

func (c *Controller) bucket() jetstream.KeyValue {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.kv
}

// rootSet returns an application's root StatefulSet from the cache.
func (c *Controller) rootSet(a *appState) (*appsv1.StatefulSet, error) {
	return c.stsLister.StatefulSets(c.deps.Namespace).Get(a.RootStatefulSet)
}

// appPods lists the root and worker pods of an application from the cache.
func (c *Controller) appPods(a *appState) []*corev1.Pod {
	pods, err := c.podLister.Pods(c.deps.Namespace).List(labels.SelectorFromSet(labels.Set{
		labelInstance: c.deps.Orchestra, labelApplication: a.Name,
	}))
	if err != nil {
		return nil
	}
	return pods
}

// podAnswered follows the early answer of a root or worker pod p (or its
// end).
func (c *Controller) podAnswered(p *corev1.Pod) {
	if p.Labels[labelComponent] == "root" {
		c.rootChanged(p)
	} else if a := c.app(p.Labels[labelApplication]); a != nil {
		a.kickNow()
	}
}

// rootChanged follows a change of root pod p of an application with a
// lifecycle (its own, or its early answer): the wake's clock, the
// application's step and the dispatcher's roots.
func (c *Controller) rootChanged(p *corev1.Pod) {
	a := c.app(p.Labels[labelApplication])
	if a == nil {
		return
	}
	if c.podServes(p) {
		a.rootServingSeen.CompareAndSwap(0, c.now().UnixNano())
	}
	a.kickNow()
	if c.deps.RootPods != nil {
		c.deps.RootPods(a.Name, c.rootPods(a))
	}
}

// podServes reports whether a root or worker pod takes requests: Ready and
// not terminating (RootServes), or, until the kubelet says Ready,
// answering its probes (earlyready.go).
func (c *Controller) podServes(p *corev1.Pod) bool {
	return RootServes(p) || c.early.serves(p)
}

// rootPods lists the root pods of an application from the cache.
func (c *Controller) rootPods(a *appState) []RootPod {
	var out []RootPod
	for _, p := range c.appPods(a) {
		if p.Labels[labelComponent] == "root" {
			out = append(out, RootPod{Pod: p, Serves: c.podServes(p)})
		}
	}
	return out
}

// ObserveFirstToken records the first_token stage of a wake when the first
// answer data of a request stored at stored and delivered to this
// dispatcher at delivered goes out now: once per wake, for a request that
// waited for it (stored while the application was not awake), timed from
// rootsSince, when this dispatcher's pool got the root that the wake
// started; and hands the time to the leader for
// lastWake.firstTokenSeconds (firsttoken.go).
func (c *Controller) ObserveFirstToken(app string, stored, delivered, rootsSince time.Time) {
	a := c.app(app)
	if a == nil {
		return
	}
	now := c.now()
	t := firstAnswer{stored: stored, delivered: delivered, rootsSince: rootsSince, now: now}
	if c.observeFirstToken(a, t) {
		return
	}
	// The answer went out before this dispatcher heard of the wake from
	// the lifecycle bucket (the leader publishes it there; the watch is
	// asynchronous): wait for the state to catch up, briefly, off the
	// request's path. Warm requests never get here: the state of an
	// awake application is known.
	t.late = true
	go func() {
		deadline := time.Now().Add(firstTokenStateWait)
		for time.Now().Before(deadline) {
			time.Sleep(firstTokenStateWait / 40)
			if c.observeFirstToken(a, t) {
				return
			}
		}
	}()
}

// firstTokenStateWait bounds how long a first answer waits for the
// lifecycle state of its wake to reach this dispatcher.
const firstTokenStateWait = 2 * time.Second

// firstAnswer is the moments of a first answer: its request stored,
// delivered to this dispatcher, this dispatcher's pool got its roots
// (rootsSince), and its first data sent (now). late is true when the data
// went out before this dispatcher heard of the wake.
type firstAnswer struct {
	stored, delivered, rootsSince, now time.Time
	late                               bool
}

// waitedForWake tells whether the request of a first answer waited for the
// wake of st (a cold request) rather than finding the application awake.
// A request stored before the wake's root joined this dispatcher's pool,
// or before the application turned Awake (the bucket gives that moment to
// the nanosecond), waited. So does one whose answer went out before this
// dispatcher heard of the wake (late): a warm request never gets there, as
// the state of an awake application is known.
func waitedForWake(st v1alpha1.LifecycleStatus, t firstAnswer) bool {
	return t.late || st.State != v1alpha1.LifecycleAwake ||
		(st.Since != nil && t.stored.Before(st.Since.Time)) || t.stored.Before(t.rootsSince)
}

// observeFirstToken is ObserveFirstToken for a first answer t; it reports
// false when this dispatcher does not know the wake yet (no state, no last
// wake, or a state that is neither waking nor awake).
func (c *Controller) observeFirstToken(a *appState, t firstAnswer) bool {
	rootsSince, now := t.rootsSince, t.now
	c.mu.Lock()
	states := c.states
	c.mu.Unlock()
	if states == nil {
		return true
	}
	st, ok := states.Lookup(a.Name)
	if !ok || st.LastWake == nil || st.LastWake.StartTime == nil ||
		(st.State != v1alpha1.LifecycleWaking && st.State != v1alpha1.LifecycleAwake) {
		return false
	}
	wake := st.LastWake.StartTime.Time
	if !waitedForWake(st, t) {
		return true // a warm request
	}
	once := func(v *atomic.Int64) bool {
		prev := v.Load()
		return prev != wake.UnixNano() && v.CompareAndSwap(prev, wake.UnixNano())
	}
	if rootsSince.After(wake) && once(&a.firstToken) {
		c.m.wakeSeconds.WithLabelValues(a.Name, stageFirstToken).Observe(now.Sub(rootsSince).Seconds())
		// Where the first token's time went on this dispatcher: the root
		// joining its pool -> the request delivered (the gate, the pull)
		// -> the first answer data sent (the engine).
		c.log.Info("first answer of a wake", "app", a.Name, "rootToDelivery", t.delivered.Sub(rootsSince),
			"deliveryToFirstData", now.Sub(t.delivered), "rootToFirstData", now.Sub(rootsSince))
	}
	// The wake is the current one: under way, or what made it awake (not
	// the wake before a sleep that a request cancelled).
	current := st.State == v1alpha1.LifecycleWaking || (st.State == v1alpha1.LifecycleAwake && st.Since != nil && !st.Since.Time.Before(wake))
	if current && once(&a.firstTokenSent) {
		c.publishFirstToken(a.Name, wake, now)
	}
	return true
}

// ObserveQueueWait records the queue wait of a request first delivered now
// and stored at stored: cold when it was stored while its application was
// not awake (it waited for a wake), warm otherwise.
func (c *Controller) ObserveQueueWait(app string, stored time.Time) {
	if c.app(app) == nil {
		return // no lifecycle: the dispatcher's own queue_wait_seconds covers it
	}
	c.mu.Lock()
	states := c.states
	c.mu.Unlock()
	cold := false
	if states != nil {
		if st, ok := states.Lookup(app); ok {
			cold = st.State != v1alpha1.LifecycleAwake || (st.Since != nil && stored.Before(st.Since.Time))
		}
	}
	c.m.queueWait.WithLabelValues(app, strconv.FormatBool(cold)).Observe(c.now().Sub(stored).Seconds())
}
