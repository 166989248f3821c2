package fetch

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Phase is the coarse state of a run, as published in progress.json.
type Phase string

// Phases in the order a successful run goes through them.
const (
	PhasePending     Phase = "Pending"
	PhaseDownloading Phase = "Downloading"
	PhaseVerifying   Phase = "Verifying"
	PhaseComplete    Phase = "Complete"
	PhaseFailed      Phase = "Failed"
)

// ProgressKey is the ConfigMap data key holding the Status JSON.
const ProgressKey = "progress.json"

// Status is the progress document (ConfigMap key progress.json).
type Status struct {
	Phase              Phase   `json:"phase"`
	BytesDone          int64   `json:"bytesDone"`
	BytesTotal         int64   `json:"bytesTotal"`
	Files              int     `json:"files"`
	FilesDone          int     `json:"filesDone"`
	RateBytesPerSecond float64 `json:"rateBytesPerSecond"`
	ETASeconds         int64   `json:"etaSeconds"`
	Verified           bool    `json:"verified"`
	Message            string  `json:"message"`
	UpdatedAt          string  `json:"updatedAt"`
	// Sizing is the model's size and memory estimate, once read.
	Sizing *Sizing `json:"sizing,omitempty"`
}

// ProgressSink receives Status snapshots. final is true for the last one.
type ProgressSink interface {
	Report(ctx context.Context, s Status, final bool) error
}

// tracker holds the live counters; the downloader writes, sinks read.
type tracker struct {
	bytesDone atomic.Int64

	mu         sync.Mutex
	phase      Phase
	message    string
	verified   bool
	sizing     *Sizing
	files      int
	filesDone  int
	bytesTotal int64
	samples    []sample // for the rate, last ~10 s
	kick       chan struct{}
}

type sample struct {
	t     time.Time
	bytes int64
}

func newTracker() *tracker {
	return &tracker{phase: PhasePending, kick: make(chan struct{}, 1)}
}

func (t *tracker) add(n int64) { t.bytesDone.Add(n) }

func (t *tracker) setPhase(p Phase, msg string) {
	t.mu.Lock()
	t.phase, t.message = p, msg
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

func (t *tracker) setTotals(files int, bytes int64) {
	t.mu.Lock()
	t.files, t.bytesTotal = files, bytes
	t.mu.Unlock()
}

func (t *tracker) fileDone() {
	t.mu.Lock()
	t.filesDone++
	t.mu.Unlock()
}

func (t *tracker) setVerified(v bool) {
	t.mu.Lock()
	t.verified = v
	t.mu.Unlock()
}

// snapshot computes the Status now, including the rate over the last ~10 s.
func (t *tracker) snapshot(now time.Time) Status {
	done := t.bytesDone.Load()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.samples = append(t.samples, sample{now, done})
	for len(t.samples) > 2 && now.Sub(t.samples[0].t) > 10*time.Second {
		t.samples = t.samples[1:]
	}
	var rate float64
	if first := t.samples[0]; now.Sub(first.t) > 0 {
		rate = float64(done-first.bytes) / now.Sub(first.t).Seconds()
	}
	eta := int64(-1)
	if rate > 0 && t.bytesTotal >= done {
		eta = int64(math.Ceil(float64(t.bytesTotal-done) / rate))
	}
	if t.phase == PhaseComplete {
		eta = 0
	}
	return Status{
		Phase:              t.phase,
		BytesDone:          done,
		BytesTotal:         t.bytesTotal,
		Files:              t.files,
		FilesDone:          t.filesDone,
		RateBytesPerSecond: math.Round(rate*10) / 10,
		ETASeconds:         eta,
		Verified:           t.verified,
		Message:            t.message,
		Sizing:             t.sizing,
		UpdatedAt:          now.UTC().Format(time.RFC3339),
	}
}

// reporter drives the sinks, each on its own goroutine and interval, so a
// slow API server never delays the terminal bar or the download.
type reporter struct {
	t      *tracker
	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup
	stop   chan struct{}
}

type sinkSpec struct {
	sink  ProgressSink
	every time.Duration
	name  string
}

func startReporter(t *tracker, log *slog.Logger, sinks []sinkSpec) *reporter {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reporter{t: t, log: log, cancel: cancel, stop: make(chan struct{})}
	kicks := make([]chan struct{}, len(sinks))
	for i, s := range sinks {
		kicks[i] = make(chan struct{}, 1)
		r.wg.Add(1)
		go r.run(ctx, s, kicks[i])
	}
	// Fan phase changes out to every sink.
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			select {
			case <-r.stop:
				return
			case <-t.kick:
				for _, k := range kicks {
					select {
					case k <- struct{}{}:
					default:
					}
				}
			}
		}
	}()
	return r
}

func (r *reporter) run(ctx context.Context, s sinkSpec, kick <-chan struct{}) {
	defer r.wg.Done()
	tick := time.NewTicker(s.every)
	defer tick.Stop()
	failures := 0
	send := func(final bool) {
		st := r.t.snapshot(time.Now())
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := s.sink.Report(cctx, st, final); err != nil {
			failures++
			// The download never fails because progress could not be written.
			if failures == 1 || failures%10 == 0 || final {
				r.log.Warn("writing progress failed", "sink", s.name, "failures", failures, "err", err)
			}
		}
	}
	for {
		select {
		case <-r.stop:
			send(true)
			return
		case <-tick.C:
			send(false)
		case <-kick:
			send(false)
		}
	}
}

// Stop sends the final status to every sink and waits (at most ~10 s for a
// remote sink).
func (r *reporter) Stop() {
	close(r.stop)
	r.wg.Wait()
	r.cancel()
}

// logSink writes progress as structured log records.
type logSink struct{ log *slog.Logger }

func (l logSink) Report(_ context.Context, s Status, final bool) error {
	l.log.Info("progress", "phase", s.Phase, "bytesDone", s.BytesDone, "bytesTotal", s.BytesTotal,
		"files", s.Files, "filesDone", s.FilesDone, "rateBytesPerSecond", s.RateBytesPerSecond,
		"etaSeconds", s.ETASeconds, "verified", s.Verified, "final", final)
	return nil
}

// barSink draws a one-line progress bar (for a terminal).
type barSink struct{ w io.Writer }

func (b barSink) Report(_ context.Context, s Status, final bool) error {
	const width = 30
	frac := 0.0
	if s.BytesTotal > 0 {
		frac = math.Min(1, float64(s.BytesDone)/float64(s.BytesTotal))
	}
	filled := int(frac * width)
	eta := "--"
	if s.ETASeconds >= 0 {
		eta = (time.Duration(s.ETASeconds) * time.Second).String()
	}
	line := fmt.Sprintf("\r\033[K%-11s [%s%s] %5.1f%% %s/%s %s/s ETA %s files %d/%d",
		s.Phase, strings.Repeat("=", filled), strings.Repeat(" ", width-filled), frac*100,
		FormatBytes(s.BytesDone), FormatBytes(s.BytesTotal), FormatBytes(int64(s.RateBytesPerSecond)), eta,
		s.FilesDone, s.Files)
	if final {
		line += "\n"
	}
	_, err := io.WriteString(b.w, line)
	return err
}

// ConfigMapSink merges progress.json into an existing ConfigMap. It needs
// only "patch" on that one ConfigMap.
type ConfigMapSink struct {
	Client    kubernetes.Interface
	Namespace string
	Name      string
}

// Report implements ProgressSink.
func (c *ConfigMapSink) Report(ctx context.Context, s Status, _ bool) error {
	doc, err := json.Marshal(s)
	if err != nil {
		return err
	}
	patch, err := json.Marshal(map[string]any{"data": map[string]string{ProgressKey: string(doc)}})
	if err != nil {
		return err
	}
	_, err = c.Client.CoreV1().ConfigMaps(c.Namespace).Patch(ctx, c.Name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: "orchestra-fetch"})
	if err != nil {
		return fmt.Errorf("patching ConfigMap %s/%s: %w", c.Namespace, c.Name, err)
	}
	return nil
}

// ServiceAccountNamespaceFile is where a pod finds its namespace.
const ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// PodNamespace returns the namespace of the pod this runs in, or "".
func PodNamespace() string {
	b, err := os.ReadFile(ServiceAccountNamespaceFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// NewKubeClient uses the in-cluster config, or the kubeconfig outside a pod.
func NewKubeClient() (kubernetes.Interface, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			clientcmd.NewDefaultClientConfigLoadingRules(), nil).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("no in-cluster config and no kubeconfig: %w", err)
		}
	}
	rc.UserAgent = "orchestra-fetch"
	rc.Timeout = 15 * time.Second
	return kubernetes.NewForConfig(rc)
}
