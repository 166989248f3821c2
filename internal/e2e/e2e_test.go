package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/e2e/stack"
)

const (
	readyTimeout = 6 * time.Minute
	app          = "echo" // the application of config/samples/simulator.yaml
)

// TestLifecycle takes one simulator ModelOrchestra, made from
// config/samples/simulator.yaml, through its life: Ready with real pods and
// a streamed chat through the gateway, scaled, reconfigured, deleted. The
// steps build on each other, so a failed step stops the test.
func TestLifecycle(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-lifecycle")
	const name = "life"

	token := apiToken(ctx, t, ns)
	obj := simulatorResource(t, ns, name)
	must(t, unstructured.SetNestedField(obj.Object, int64(1), "spec", "applications", app, "scaling", "replicas"))
	served, _, _ := unstructured.NestedString(obj.Object, "spec", "applications", app, "serving", "servedModelName")

	var base string
	ok := t.Run("ready with real pods, and a streamed chat through the gateway", func(t *testing.T) {
		if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
			t.Fatal(err)
		}
		mo := waitReady(ctx, t, ns, name)
		if got := mo.Status.Applications[app]; got.ReadyReplicas != 1 || got.ServedModelName != served || got.Model.Phase != "Complete" {
			t.Errorf("status.applications.%s = ready %d, served %q, model %q; want 1, %q, Complete", app, got.ReadyReplicas, got.ServedModelName, got.Model.Phase, served)
		}
		requireRealPods(ctx, t, ns, name)
		requireFetchedFromMirror(ctx, t, ns, name, mo.Status.Applications[app].Model)

		var err error
		base, err = stack.GatewayURL(ctx, env.cs, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		// The first request after Ready may find the NodePort not yet
		// programmed by kube-proxy.
		res, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 24, nil, 30*time.Second)
		if err != nil {
			t.Fatalf("streamed chat through %s: %v", base, err)
		}
		if res.Chunks < 2 || strings.TrimSpace(res.Content) == "" || res.FinishReason == "" {
			t.Errorf("streamed answer = %d chunks, %q, finish_reason %q; want several chunks of text and a finish reason", res.Chunks, res.Content, res.FinishReason)
		}
		// The simulator's answer is a function of the request: the same
		// request through the whole stack gives the same text.
		if again := chat(ctx, t, base, token, served); again.Content != res.Content {
			t.Errorf("second identical request answered %q, first %q", again.Content, res.Content)
		}
		for _, tc := range []struct{ token, code string }{{"", "missing_api_key"}, {"sk-not-a-token", "invalid_api_key"}} {
			_, err := stack.StreamChat(ctx, base, tc.token, served, "hello", 8, nil)
			var apiErr *stack.APIError
			if !errors.As(err, &apiErr) || apiErr.Status != http.StatusUnauthorized || apiErr.Code != tc.code {
				t.Errorf("chat with token %q: err = %v; want HTTP 401 %s", tc.token, err, tc.code)
			}
		}
	})
	if !ok {
		t.FailNow()
	}

	ok = t.Run("scaling replicas updates the root StatefulSet", func(t *testing.T) {
		patch(ctx, t, ns, name, `{"spec":{"applications":{"`+app+`":{"scaling":{"replicas":2}}}}}`)
		sts := name + "-" + app
		eventually(t, readyTimeout, func() error {
			s, err := env.cs.AppsV1().StatefulSets(ns).Get(ctx, sts, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if s.Spec.Replicas == nil || *s.Spec.Replicas != 2 || s.Status.ReadyReplicas != 2 {
				return fmt.Errorf("StatefulSet %s has %d of %d replicas ready, want 2 of 2", sts, s.Status.ReadyReplicas, s.Status.Replicas)
			}
			return nil
		})
		mo := waitReady(ctx, t, ns, name)
		if got := mo.Status.Applications[app]; got.Replicas != 2 || got.ReadyReplicas != 2 {
			t.Errorf("status.applications.%s replicas = %d/%d ready; want 2/2", app, got.ReadyReplicas, got.Replicas)
		}
	})
	if !ok {
		t.FailNow()
	}

	ok = t.Run("a changed gateway limit rolls the gateway pods and applies", func(t *testing.T) {
		dep := name + "-gateway"
		before, err := env.cs.AppsV1().Deployments(ns).Get(ctx, dep, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		oldSum := before.Spec.Template.Annotations["modelorchestra.io/config-checksum"]
		if oldSum == "" {
			t.Fatalf("Deployment %s has no modelorchestra.io/config-checksum annotation on its pod template", dep)
		}
		oldPods := podUIDs(ctx, t, ns, before)

		patch(ctx, t, ns, name, `{"spec":{"gateway":{"limits":{"requestsPerMinute":2}}}}`)
		eventually(t, readyTimeout, func() error {
			d, err := env.cs.AppsV1().Deployments(ns).Get(ctx, dep, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if sum := d.Spec.Template.Annotations["modelorchestra.io/config-checksum"]; sum == oldSum {
				return fmt.Errorf("the gateway's config checksum is still %q after the limit changed", sum)
			}
			if !rolledOut(d) {
				return fmt.Errorf("Deployment %s has not rolled out the new config", dep)
			}
			// Every old pod is gone, so no request reaches a pod with the
			// old limits.
			for uid := range podUIDs(ctx, t, ns, d) {
				if oldPods.Has(uid) {
					return fmt.Errorf("gateway pod %s with the old limits is still there", uid)
				}
			}
			pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(d.Spec.Selector)})
			if err != nil {
				return err
			}
			for _, p := range pods.Items {
				if oldPods.Has(string(p.UID)) {
					return fmt.Errorf("gateway pod %s with the old limits is still there", p.Name)
				}
			}
			return nil
		})
		waitReady(ctx, t, ns, name)

		// requestsPerMinute 2 is a burst of 2: the third request within the
		// minute is refused by the new pods.
		var codes []int
		for range 3 {
			codes = append(codes, chatStatus(ctx, t, base, token, served))
		}
		if want := []int{200, 200, http.StatusTooManyRequests}; !slices.Equal(codes, want) {
			t.Errorf("three requests after requestsPerMinute=2 answered %v; want %v", codes, want)
		}
	})
	if !ok {
		t.FailNow()
	}

	t.Run("deleting the resource removes everything it created", func(t *testing.T) {
		manifest, err := stack.ReleaseManifest(env.kubeconfig, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		rendered := manifestObjects(t, manifest)
		kinds := sets.New[string]()
		for _, o := range rendered {
			kinds.Insert(o.GetKind())
		}
		t.Logf("the release holds %d objects of kinds %v", len(rendered), sets.List(kinds))

		if err := stack.Delete(ctx, env.dyn, ns, name, 3*time.Minute, t.Logf); err != nil {
			t.Fatal(err)
		}
		// Everything the chart rendered, by name, and whatever their
		// controllers made (pods, release Secrets), by label.
		var last string
		eventually(t, 2*time.Minute, func() error {
			left := leftovers(ctx, ns, name, rendered)
			if len(left) == 0 {
				return nil
			}
			if s := strings.Join(left, ", "); s != last {
				t.Logf("still there: %s", s)
				last = s
			}
			return fmt.Errorf("objects left after deleting %s/%s: %v", ns, name, left)
		})
	})
}

// TestInvalidResourceRejected checks that the API server refuses invalid
// resources with a message naming the field, as kubectl apply shows it.
func TestInvalidResourceRejected(t *testing.T) {
	requireCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ns := newNamespace(ctx, t, "e2e-invalid")
	valid := `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: bad}
spec:
  applications:
    chat:
      model: {source: "hf://demo/tiny-gguf", file: tiny-demo.gguf}
      runtime: {engine: simulator}
`
	for _, tc := range []struct {
		name  string
		patch func(spec map[string]any)
		want  []string // substrings of the API server's message
	}{
		{
			name: "workers on the simulator",
			patch: func(s map[string]any) {
				chatApp(s)["runtime"] = map[string]any{"engine": "simulator", "workers": int64(2)}
			},
			want: []string{"runtime.workers", "workers are supported by the llamacpp, dllama and vllm engines only"},
		},
		{
			name: "model source with an unknown scheme",
			patch: func(s map[string]any) {
				chatApp(s)["model"] = map[string]any{"source": "ftp://models/tiny", "file": "x.gguf"}
			},
			want: []string{"model.source", "source must be hf://"},
		},
		{
			name: "nodePort on a ClusterIP gateway",
			patch: func(s map[string]any) {
				s["gateway"] = map[string]any{"service": map[string]any{"type": "ClusterIP", "nodePort": int64(30099)}}
			},
			want: []string{"gateway.service.nodePort", "nodePort needs type NodePort or LoadBalancer"},
		},
		{
			name: "hub endpoint that is not an http URL",
			patch: func(s map[string]any) {
				chatApp(s)["model"] = map[string]any{"source": "hf://demo/tiny-gguf", "file": "x.gguf", "hubEndpoint": "ftp://mirror"}
			},
			want: []string{"model.hubEndpoint", "should match"},
		},
		{
			name:  "unknown field",
			patch: func(s map[string]any) { s["gateway"] = map[string]any{"replicaz": int64(2)} },
			want:  []string{`unknown field "spec.gateway.replicaz"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(valid), &obj.Object); err != nil {
				t.Fatal(err)
			}
			spec := obj.Object["spec"].(map[string]any)
			tc.patch(spec)
			_, err := env.dyn.Resource(stack.GVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{FieldValidation: "Strict"})
			if err == nil {
				_ = env.dyn.Resource(stack.GVR).Namespace(ns).Delete(ctx, "bad", metav1.DeleteOptions{})
				t.Fatalf("the API server accepted the resource; want it refused with %q", tc.want)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
				t.Errorf("error = %v (reason %s); want Invalid or BadRequest", err, apierrors.ReasonForError(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error = %q; want it to contain %q", err, w)
				}
			}
		})
	}
	// The same resource without the mistakes is accepted: the refusals
	// above are about the fields, not the base resource.
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(valid), &obj.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := env.dyn.Resource(stack.GVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{FieldValidation: "Strict", DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the valid base resource was refused: %v", err)
	}
}

func chatApp(spec map[string]any) map[string]any {
	return spec["applications"].(map[string]any)["chat"].(map[string]any)
}

// newNamespace creates a namespace for one test and deletes it afterwards.
func newNamespace(ctx context.Context, t *testing.T, name string) string {
	t.Helper()
	_, err := env.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			list, err := env.dyn.Resource(stack.GVR).Namespace(name).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				list = &unstructured.UnstructuredList{}
			}
			for _, o := range list.Items {
				if mo, err := stack.Get(context.Background(), env.dyn, name, o.GetName()); err == nil {
					t.Logf("diagnosis of %s:\n%s", o.GetName(), stack.Diagnose(context.Background(), env.cs, mo, operatorNamespace))
				}
			}
			t.Logf("operator:\n%s", operatorLogs(t, 40))
		}
		_ = env.cs.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
		// The node agent's copies outlive the namespace (docs/checkpoint.md):
		// the real node is this machine, so the test removes them itself.
		for _, dir := range tierDirs(t) {
			if err := os.RemoveAll(filepath.Join(dir, name)); err != nil {
				t.Logf("removing the namespace's tier copies: %v", err)
			}
		}
	})
	return name
}

// tierDirs are the node directories of the checkpoint agent's hot and warm
// tiers, the chart's global.agent defaults, which the e2e orchestras keep.
func tierDirs(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../charts/model-orchestra/values.yaml")
	if err != nil {
		t.Fatalf("reading the chart's values: %v", err)
	}
	var v struct {
		Global struct {
			Agent struct {
				HotPath  string `json:"hotPath"`
				WarmPath string `json:"warmPath"`
			} `json:"agent"`
		} `json:"global"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil || v.Global.Agent.HotPath == "" || v.Global.Agent.WarmPath == "" {
		t.Fatalf("the chart's global.agent.hotPath and warmPath: %+v, %v", v.Global.Agent, err)
	}
	return []string{v.Global.Agent.HotPath, v.Global.Agent.WarmPath}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// apiToken returns the API token of the Secret e2e-token in ns, which the
// stacks' gateways accept (created on first use).
func apiToken(ctx context.Context, t *testing.T, ns string) string {
	t.Helper()
	token, err := stack.EnsureToken(ctx, env.cs, ns, "e2e-token")
	if err != nil {
		t.Fatal(err)
	}
	return token
}

// stepLogf returns t.Logf with each line stamped with the seconds since
// the call, so that a test's log reads as a timeline.
func stepLogf(t *testing.T) func(format string, args ...any) {
	start := time.Now()
	return func(format string, args ...any) {
		t.Helper()
		t.Logf("[%3.0fs] "+format, append([]any{time.Since(start).Seconds()}, args...)...)
	}
}

// deployAndChat applies obj, waits for it to be Ready and for a first
// streamed chat through its gateway (whose NodePort kube-proxy may not
// have programmed yet), and returns the gateway's base URL and the model
// name the application serves.
func deployAndChat(ctx context.Context, t *testing.T, ns, name, token string, obj *unstructured.Unstructured) (base, served string) {
	t.Helper()
	served, _, _ = unstructured.NestedString(obj.Object, "spec", "applications", app, "serving", "servedModelName")
	if _, err := stack.Apply(ctx, env.dyn, obj); err != nil {
		t.Fatal(err)
	}
	waitReady(ctx, t, ns, name)
	base, err := stack.GatewayURL(ctx, env.cs, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stack.StreamChatOnceReachable(ctx, base, token, served, chatPrompt, 8, nil, 30*time.Second); err != nil {
		t.Fatalf("first chat through %s: %v", base, err)
	}
	return base, served
}

func waitReady(ctx context.Context, t *testing.T, ns, name string) *v1alpha1.ModelOrchestra {
	t.Helper()
	start := time.Now()
	mo, err := stack.WaitReady(ctx, env.dyn, env.cs, ns, name, stack.WaitOptions{
		Timeout:           readyTimeout,
		OperatorNamespace: operatorNamespace,
		Progress:          func(l string) { t.Logf("[%3.0fs] %s", time.Since(start).Seconds(), l) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return mo
}

func patch(ctx context.Context, t *testing.T, ns, name, p string) {
	t.Helper()
	if _, err := env.dyn.Resource(stack.GVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patching %s/%s with %s: %v", ns, name, p, err)
	}
}

// chatStatus sends one small streamed chat and returns its HTTP status. A
// connection that fails before any answer (kube-proxy still sending to a
// pod that just went away) is retried: it never reached a gateway.
func chatStatus(ctx context.Context, t *testing.T, base, token, model string) int {
	t.Helper()
	for attempt := 1; ; attempt++ {
		_, err := stack.StreamChat(ctx, base, token, model, "count", 4, nil)
		if err == nil {
			return http.StatusOK
		}
		var apiErr *stack.APIError
		if errors.As(err, &apiErr) {
			return apiErr.Status
		}
		if attempt == 10 {
			t.Fatalf("chat through %s: %v", base, err)
		}
		t.Logf("chat through %s: %v; retrying", base, err)
		time.Sleep(time.Second)
	}
}

// chatPrompt is the prompt of chat.
const chatPrompt = "What does an orchestra conductor do?"

func chat(ctx context.Context, t *testing.T, base, token, model string) *stack.ChatResult {
	t.Helper()
	res, err := stack.StreamChat(ctx, base, token, model, chatPrompt, 24, nil)
	if err != nil {
		t.Fatalf("streamed chat through %s: %v", base, err)
	}
	return res
}

// requireRealPods checks that the stack's pods run as containers on the
// real node (not simulated by kwok).
func requireRealPods(ctx context.Context, t *testing.T, ns, name string) {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name})
	if err != nil {
		t.Fatal(err)
	}
	components := sets.New[string]()
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		components.Insert(p.Labels["app.kubernetes.io/component"])
		for _, s := range p.Status.ContainerStatuses {
			if !strings.HasPrefix(s.ContainerID, "containerd://") {
				t.Errorf("pod %s container %s has container id %q; want a containerd container", p.Name, s.Name, s.ContainerID)
			}
		}
	}
	for _, c := range []string{"root", "gateway", "dispatcher", "nats"} {
		if !components.Has(c) {
			t.Errorf("no running %s pod among %d pods (running components %v)", c, len(pods.Items), sets.List(components))
		}
	}
}

// requireFetchedFromMirror checks that the model came the real way: the
// operator's own fetch Job ran orchestra-fetch against the mirror
// (model.hubEndpoint as --hf-endpoint), succeeded, and the status reports
// the demo repository's bytes.
func requireFetchedFromMirror(ctx context.Context, t *testing.T, ns, name string, model v1alpha1.ModelStatus) {
	t.Helper()
	// The model is reported verified from the fetcher's own final report,
	// which can reach the status a moment before the Job controller counts
	// the finished pod: wait for the Job to catch up.
	var j batchv1.Job
	eventually(t, 30*time.Second, func() error {
		jobs, err := env.cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + name + ",app.kubernetes.io/component=model-fetch"})
		if err != nil {
			return err
		}
		if len(jobs.Items) != 1 {
			return fmt.Errorf("%d fetch Jobs; want the operator's one", len(jobs.Items))
		}
		j = jobs.Items[0]
		if j.Status.Succeeded < 1 {
			return fmt.Errorf("fetch Job %s: succeeded %d, failed %d; want it to succeed", j.Name, j.Status.Succeeded, j.Status.Failed)
		}
		return nil
	})
	args := j.Spec.Template.Spec.Containers[0].Args
	if !slices.Contains(args, "--hf-endpoint="+env.hub) {
		t.Errorf("fetch Job %s args %v; want --hf-endpoint=%s", j.Name, args, env.hub)
	}
	var total int64
	for _, data := range stack.TinyModelFiles() {
		total += int64(len(data))
	}
	if model.Phase != "Complete" || model.BytesTotal != total || model.FilesTotal != int32(len(stack.TinyModelFiles())) {
		t.Errorf("status model = phase %q, %d/%d bytes, %d files; want Complete with the mirror's %d files, %d bytes", model.Phase, model.Bytes, model.BytesTotal, model.FilesTotal, len(stack.TinyModelFiles()), total)
	}
}

func rolledOut(d *appsv1.Deployment) bool {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	return d.Status.ObservedGeneration >= d.Generation && d.Status.UpdatedReplicas == want &&
		d.Status.AvailableReplicas == want && d.Status.Replicas == want
}

func podUIDs(ctx context.Context, t *testing.T, ns string, d *appsv1.Deployment) sets.Set[string] {
	t.Helper()
	pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(d.Spec.Selector)})
	uids := sets.New[string]()
	if err != nil {
		return uids
	}
	for _, p := range pods.Items {
		uids.Insert(string(p.UID))
	}
	return uids
}

func manifestObjects(t *testing.T, manifest string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(manifest, "\n---") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		o := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &o.Object); err != nil {
			t.Fatalf("decoding the release manifest: %v", err)
		}
		if o.Object == nil || o.GetKind() == "" {
			continue
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatal("the release manifest holds no objects")
	}
	return objs
}

// leftovers lists what still exists of the rendered objects, plus pods,
// release Secrets and any object labelled with the instance in the
// namespace.
func leftovers(ctx context.Context, ns, name string, rendered []*unstructured.Unstructured) []string {
	var left []string
	for _, o := range rendered {
		gvk := o.GroupVersionKind()
		m, err := env.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			left = append(left, fmt.Sprintf("%s %s (no REST mapping: %v)", gvk.Kind, o.GetName(), err))
			continue
		}
		objNS := o.GetNamespace()
		if objNS == "" && m.Scope.Name() == "namespace" {
			objNS = ns
		}
		_, err = env.dyn.Resource(m.Resource).Namespace(objNS).Get(ctx, o.GetName(), metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("%s %s", gvk.Kind, o.GetName()))
		}
	}
	byLabel := "app.kubernetes.io/instance=" + name
	if pods, err := env.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: byLabel}); err == nil {
		for _, p := range pods.Items {
			left = append(left, "Pod "+p.Name)
		}
	}
	if secrets, err := env.cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{LabelSelector: "owner=helm,name=" + name}); err == nil {
		for _, s := range secrets.Items {
			left = append(left, "release Secret "+s.Name)
		}
	}
	for _, gvr := range []struct{ kind, group, version, resource string }{
		{"EndpointSlice", "discovery.k8s.io", "v1", "endpointslices"},
		{"ControllerRevision", "apps", "v1", "controllerrevisions"},
		{"PersistentVolumeClaim", "", "v1", "persistentvolumeclaims"},
	} {
		list, err := env.dyn.Resource(schema.GroupVersionResource{Group: gvr.group, Version: gvr.version, Resource: gvr.resource}).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: byLabel})
		if err != nil {
			continue
		}
		for _, o := range list.Items {
			left = append(left, gvr.kind+" "+o.GetName())
		}
	}
	return left
}

func operatorLogs(t *testing.T, lines int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pods, err := env.cs.CoreV1().Pods(operatorNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		rc, err := env.cs.CoreV1().Pods(operatorNamespace).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: &lines}).Stream(ctx)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", p.Name, err)
			continue
		}
		sc := bufio.NewScanner(io.LimitReader(rc, 1<<20))
		for sc.Scan() {
			fmt.Fprintf(&b, "%s: %s\n", p.Name, sc.Text())
		}
		_ = rc.Close() // a read-only log stream
	}
	return b.String()
}
