package stack

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// GVR is the ModelOrchestra resource.
var GVR = schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group, Version: v1alpha1.GroupVersion.Version, Resource: "modelorchestras"}

// FieldManager is the server-side apply field manager of the demo and tests.
const FieldManager = "orchestra-demo"

// LoadResource reads one ModelOrchestra from a YAML file (a sample).
func LoadResource(path string) (*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &obj.Object); err != nil {
		return nil, fmt.Errorf("decoding %s: %w", path, err)
	}
	if obj.GetKind() != v1alpha1.Kind {
		return nil, fmt.Errorf("%s holds a %q, not a %s", path, obj.GetKind(), v1alpha1.Kind)
	}
	return obj, nil
}

// MirrorModel points every application of obj at the demo model in the
// mirror: source hf://demo/tiny-gguf with model.hubEndpoint set to hub (a
// URL the fetch pod reaches), the GGUF file, and a small cache claim. The
// operator's own fetch Job then downloads it from the mirror.
func MirrorModel(obj *unstructured.Unstructured, hub string) error {
	apps, _, err := unstructured.NestedMap(obj.Object, "spec", "applications")
	if err != nil || len(apps) == 0 {
		return fmt.Errorf("%s has no spec.applications", obj.GetName())
	}
	for name := range apps {
		model := map[string]any{
			"source":      "hf://" + DemoModel,
			"hubEndpoint": hub,
			"format":      "gguf",
			"file":        DemoFile,
			"cache":       map[string]any{"size": "1Gi"},
		}
		if err := unstructured.SetNestedMap(obj.Object, model, "spec", "applications", name, "model"); err != nil {
			return err
		}
	}
	return nil
}

// Apply server-side applies obj (a ModelOrchestra) and returns the live object.
func Apply(ctx context.Context, dyn dynamic.Interface, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	obj = obj.DeepCopy()
	obj.SetManagedFields(nil)
	obj.SetResourceVersion("")
	unstructured.RemoveNestedField(obj.Object, "status")
	live, err := dyn.Resource(GVR).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("applying %s %s/%s: %w", v1alpha1.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return live, nil
}

// Get reads a ModelOrchestra as the typed API object.
func Get(ctx context.Context, dyn dynamic.Interface, namespace, name string) (*v1alpha1.ModelOrchestra, error) {
	u, err := dyn.Resource(GVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	mo := &v1alpha1.ModelOrchestra{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, mo); err != nil {
		return nil, fmt.Errorf("decoding %s/%s: %w", namespace, name, err)
	}
	return mo, nil
}

// Delete deletes a ModelOrchestra and waits until it is gone, that is until
// the operator has uninstalled its release and removed its finalizer. A
// missing resource is not an error.
func Delete(ctx context.Context, dyn dynamic.Interface, namespace, name string, timeout time.Duration, logf func(string, ...any)) error {
	res := dyn.Resource(GVR).Namespace(namespace)
	err := res.Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		logf("%s %s/%s does not exist", v1alpha1.Kind, namespace, name)
		return nil
	}
	if err != nil {
		return fmt.Errorf("deleting %s/%s: %w", namespace, name, err)
	}
	logf("deleted %s %s/%s; waiting for the operator to uninstall it", v1alpha1.Kind, namespace, name)
	var last *unstructured.Unstructured
	err = wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		u, err := res.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		last = u
		return false, nil
	})
	if err != nil {
		why := ""
		if last != nil {
			why = fmt.Sprintf(" (finalizers %v)", last.GetFinalizers())
		}
		return fmt.Errorf("%s/%s is still there after %s%s: is the operator running? %w", namespace, name, timeout, why, err)
	}
	return nil
}

// Ready reports whether mo's Ready condition is True for its current
// generation.
func Ready(mo *v1alpha1.ModelOrchestra) bool {
	c := meta.FindStatusCondition(mo.Status.Conditions, v1alpha1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration >= mo.Generation &&
		mo.Status.ObservedGeneration >= mo.Generation
}

// Progress is one line describing where a ModelOrchestra stands: phase,
// the readiness conditions and, per application, the model download and
// the ready roots.
func Progress(mo *v1alpha1.ModelOrchestra) string {
	var b strings.Builder
	phase := string(mo.Status.Phase)
	if phase == "" {
		phase = "(none yet)"
	}
	fmt.Fprintf(&b, "phase %s", phase)
	for _, t := range []string{v1alpha1.ConditionDeployed, v1alpha1.ConditionModelReady, v1alpha1.ConditionTopologyReady, v1alpha1.ConditionGatewayReady, v1alpha1.ConditionReady} {
		if c := meta.FindStatusCondition(mo.Status.Conditions, t); c != nil {
			fmt.Fprintf(&b, " | %s=%s", t, c.Status)
			if c.Status != metav1.ConditionTrue {
				fmt.Fprintf(&b, " (%s)", c.Reason)
			}
		}
	}
	names := make([]string, 0, len(mo.Status.Applications))
	for n := range mo.Status.Applications {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		a := mo.Status.Applications[n]
		fmt.Fprintf(&b, " | %s: model %s", n, orDash(a.Model.Phase))
		if a.Model.BytesTotal > 0 {
			fmt.Fprintf(&b, " %d%% (%s/%s)", a.Model.ProgressPercent, humanBytes(a.Model.Bytes), humanBytes(a.Model.BytesTotal))
		}
		fmt.Fprintf(&b, ", roots %d/%d", a.ReadyReplicas, a.Replicas)
		if a.Workers > 0 {
			fmt.Fprintf(&b, ", workers %d/%d", a.ReadyWorkers, a.Workers)
		}
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// WaitOptions tune WaitReady.
type WaitOptions struct {
	Timeout time.Duration // default 10m
	// Progress is called with a new Progress line whenever it changes.
	Progress func(string)
	// OperatorNamespace is where the operator runs; its logs are part of
	// the diagnosis when the resource gets no status.
	OperatorNamespace string
}

// WaitReady waits until the ModelOrchestra is Ready for its current
// generation. On timeout the error holds a diagnosis: the conditions that
// are not True with their messages, the stack's pods that are not ready
// with their last log lines, and warning events.
func WaitReady(ctx context.Context, dyn dynamic.Interface, cs kubernetes.Interface, namespace, name string, o WaitOptions) (*v1alpha1.ModelOrchestra, error) {
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Minute
	}
	var last *v1alpha1.ModelOrchestra
	line := ""
	err := wait.PollUntilContextTimeout(ctx, 2*time.Second, o.Timeout, true, func(ctx context.Context) (bool, error) {
		mo, err := Get(ctx, dyn, namespace, name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return false, err
			}
			return false, nil
		}
		last = mo
		if l := Progress(mo); l != line && o.Progress != nil {
			line = l
			o.Progress(l)
		}
		return Ready(mo), nil
	})
	if err != nil {
		return last, fmt.Errorf("%s %s/%s is not Ready after %s: %w\n%s", v1alpha1.Kind, namespace, name, o.Timeout, err,
			Diagnose(context.WithoutCancel(ctx), cs, last, o.OperatorNamespace))
	}
	return last, nil
}

// Diagnose explains why mo is not Ready.
func Diagnose(ctx context.Context, cs kubernetes.Interface, mo *v1alpha1.ModelOrchestra, operatorNamespace string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var b strings.Builder
	if mo == nil {
		b.WriteString("the resource could not be read\n")
		return b.String()
	}
	if len(mo.Status.Conditions) == 0 {
		fmt.Fprintf(&b, "the operator never wrote a status: is it running and watching namespace %s?\n", mo.Namespace)
		if operatorNamespace != "" {
			b.WriteString(DiagnosePods(ctx, cs, operatorNamespace, "", 30))
		}
		return b.String()
	}
	b.WriteString("conditions:\n")
	for _, c := range mo.Status.Conditions {
		bad := c.Status != metav1.ConditionTrue
		if c.Type == v1alpha1.ConditionReleaseFailed || c.Type == v1alpha1.ConditionIrreconcilable || c.Type == v1alpha1.ConditionPaused {
			bad = c.Status == metav1.ConditionTrue
		}
		mark := "  "
		if bad {
			mark = "✗ "
		}
		fmt.Fprintf(&b, "  %s%s=%s %s: %s\n", mark, c.Type, c.Status, c.Reason, c.Message)
	}
	for n, a := range mo.Status.Applications {
		if a.Message != "" || a.Model.Message != "" {
			fmt.Fprintf(&b, "application %s: %s; model: %s\n", n, a.Message, a.Model.Message)
		}
	}
	b.WriteString(DiagnosePods(ctx, cs, mo.Namespace, "app.kubernetes.io/instance="+mo.Name, 15))
	b.WriteString(warningEvents(ctx, cs, mo.Namespace, 15))
	if operatorNamespace != "" && meta.IsStatusConditionTrue(mo.Status.Conditions, v1alpha1.ConditionReleaseFailed) {
		b.WriteString(DiagnosePods(ctx, cs, operatorNamespace, "", 30))
	}
	return b.String()
}

// DiagnosePods describes the pods matching selector in namespace that are
// not ready (and have not succeeded): their phase, the reasons of waiting
// or terminated containers, and the last tail log lines of each container.
func DiagnosePods(ctx context.Context, cs kubernetes.Interface, namespace, selector string, tail int64) string {
	pods, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return fmt.Sprintf("listing pods in %s: %v\n", namespace, err)
	}
	var b strings.Builder
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase == corev1.PodSucceeded || podReady(p) {
			continue
		}
		fmt.Fprintf(&b, "pod %s/%s: %s", namespace, p.Name, p.Status.Phase)
		for _, c := range p.Status.Conditions {
			if c.Status != corev1.ConditionTrue && c.Message != "" {
				fmt.Fprintf(&b, "; %s: %s", c.Type, c.Message)
			}
		}
		b.WriteString("\n")
		statuses := append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...)
		for _, s := range statuses {
			switch {
			case s.State.Waiting != nil:
				fmt.Fprintf(&b, "  container %s waiting: %s %s\n", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message)
			case s.State.Terminated != nil:
				fmt.Fprintf(&b, "  container %s terminated: %s exit %d %s\n", s.Name, s.State.Terminated.Reason, s.State.Terminated.ExitCode, s.State.Terminated.Message)
			case !s.Ready:
				fmt.Fprintf(&b, "  container %s running, not ready (restarts %d)\n", s.Name, s.RestartCount)
			}
			if s.LastTerminationState.Terminated != nil {
				t := s.LastTerminationState.Terminated
				fmt.Fprintf(&b, "  container %s last exit: %s exit %d\n", s.Name, t.Reason, t.ExitCode)
			}
			if s.State.Running == nil && s.State.Terminated == nil && s.LastTerminationState.Terminated == nil {
				continue // never ran: no logs
			}
			logs, err := cs.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: s.Name, TailLines: &tail}).DoRaw(ctx)
			if err != nil {
				fmt.Fprintf(&b, "  (logs of %s: %v)\n", s.Name, err)
				continue
			}
			if text := strings.TrimRight(string(logs), "\n"); text != "" {
				fmt.Fprintf(&b, "  last log lines of %s:\n    %s\n", s.Name, strings.ReplaceAll(text, "\n", "\n    "))
			}
		}
	}
	return b.String()
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func warningEvents(ctx context.Context, cs kubernetes.Interface, namespace string, n int) string {
	evs, err := cs.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: "type=Warning"})
	if err != nil || len(evs.Items) == 0 {
		return ""
	}
	items := evs.Items
	sort.Slice(items, func(i, j int) bool { return eventTime(&items[i]).Before(eventTime(&items[j])) })
	if len(items) > n {
		items = items[len(items)-n:]
	}
	var b strings.Builder
	b.WriteString("recent warning events:\n")
	for _, e := range items {
		fmt.Fprintf(&b, "  %s %s/%s %s: %s\n", eventTime(&e).Format(time.TimeOnly), e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, strings.TrimSpace(e.Message))
	}
	return b.String()
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
