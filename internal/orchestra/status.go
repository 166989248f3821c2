package orchestra

import (
	"github.com/model-orchestra/operator/internal/modelsize"

	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/plugin"
)

// StatusName is the status plugin's name in watches.yaml.
const StatusName = "modelorchestra"

// Labels the chart puts on every object, read by the status plugin.
const (
	labelComponent   = "app.kubernetes.io/component"
	labelApplication = "modelorchestra.io/application"
	labelSeatGroup   = "modelorchestra.io/seat-group"
	progressKey      = "progress.json"
)

// fetchProgress is the fetcher's progress.json (see internal/fetch).
type fetchProgress struct {
	Phase              string  `json:"phase"`
	BytesDone          int64   `json:"bytesDone"`
	BytesTotal         int64   `json:"bytesTotal"`
	Files              int32   `json:"files"`
	FilesDone          int32   `json:"filesDone"`
	RateBytesPerSecond float64 `json:"rateBytesPerSecond"`
	ETASeconds         int64   `json:"etaSeconds"`
	Verified           bool    `json:"verified"`
	Message            string  `json:"message"`
	UpdatedAt          string  `json:"updatedAt"`
	// Sizing is the model's size from its GGUF header (fetch.Sizing).
	Sizing *v1alpha1.ModelSize `json:"sizing"`
}

// Status derives the serving state of a ModelOrchestra from the live
// objects of its release: per application the model cache (fetch Job and
// progress ConfigMap) and the topology (root and worker StatefulSets), and
// for the stack the gateway (Deployment and its Service's EndpointSlices),
// the dispatcher and the in-cluster NATS servers.
type Status struct{}

// Status implements plugin.StatusPlugin.
func (Status) Status(ctx context.Context, in plugin.StatusInput) (plugin.StatusResult, error) {
	mo, err := Decode(in.Owner)
	if err != nil {
		return plugin.StatusResult{}, err
	}
	idx, err := indexObjects(in.Objects)
	if err != nil {
		return plugin.StatusResult{}, err
	}

	names := make([]string, 0, len(mo.Spec.Applications))
	for name := range mo.Spec.Applications {
		names = append(names, name)
	}
	sort.Strings(names)

	apps := map[string]v1alpha1.ApplicationStatus{}
	var notCached, failed, downloading, notServing, idle, wakeFailing, tooLarge, sizes, gpuUnchecked []string
	ready, awake := 0, 0
	for _, name := range names {
		st := applicationStatus(name, mo.Spec.Applications[name], idx)
		apps[name] = st
		if sz := st.Model.Size; sz != nil {
			sizes = append(sizes, name+": "+sizeSummary(*sz))
			if !sz.Fits {
				tooLarge = append(tooLarge, name+": "+st.Model.Message)
			}
			if sz.GPUProduct != "" && sz.GPUProductMemoryBytes == 0 {
				gpuUnchecked = append(gpuUnchecked, fmt.Sprintf("%s (%s)", name, sz.GPUProduct))
			}
		}
		switch {
		case st.Phase == v1alpha1.PhaseIdle || st.Phase == v1alpha1.PhaseAsleep || st.Phase == v1alpha1.PhaseWaking && st.Lifecycle.Message == "":
			// Requests are accepted and wait in the queue for the wake:
			// an idle or sleeping application is ready, only slower to
			// answer first.
			idle = append(idle, name)
			ready++
			continue
		case st.Phase == v1alpha1.PhaseWaking:
			wakeFailing = append(wakeFailing, fmt.Sprintf("%s: %s", name, st.Message))
			continue
		case st.Phase == v1alpha1.PhaseReady || st.Phase == v1alpha1.PhaseDegraded:
			awake++
		}
		switch {
		case st.Phase == v1alpha1.PhaseFailed:
			failed = append(failed, fmt.Sprintf("%s: %s", name, st.Message))
		case st.Model.Phase != "Complete":
			notCached = append(notCached, fmt.Sprintf("%s %d%%", name, st.Model.ProgressPercent))
			if st.Phase == v1alpha1.PhaseDownloading {
				downloading = append(downloading, name)
			}
		}
		if st.Phase == v1alpha1.PhaseReady || st.Phase == v1alpha1.PhaseStopped {
			ready++
		} else {
			notServing = append(notServing, fmt.Sprintf("%s %d/%d replicas ready", name, st.ReadyReplicas, st.Replicas))
		}
	}

	gen := in.Owner.GetGeneration()
	cond := func(t string, ok bool, reason, msg string) metav1.Condition {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		return metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen}
	}

	var modelCond metav1.Condition
	switch {
	case len(tooLarge) > 0:
		modelCond = cond(v1alpha1.ConditionModelReady, false, v1alpha1.ReasonModelTooLarge, "model too large for its engine, no engine started: "+strings.Join(tooLarge, "; "))
	case len(failed) > 0:
		modelCond = cond(v1alpha1.ConditionModelReady, false, v1alpha1.ReasonModelFetchFailed, "model fetch failed: "+strings.Join(failed, "; "))
	case len(notCached) > 0 && len(downloading) > 0:
		modelCond = cond(v1alpha1.ConditionModelReady, false, v1alpha1.ReasonModelDownloading, "downloading: "+strings.Join(notCached, ", "))
	case len(notCached) > 0:
		modelCond = cond(v1alpha1.ConditionModelReady, false, v1alpha1.ReasonModelPending, "waiting for the model fetch: "+strings.Join(notCached, ", "))
	default:
		msg := "every model is cached and verified"
		if len(gpuUnchecked) > 0 {
			msg += "; GPU memory not checked, the product is not in the operator's table: " + strings.Join(gpuUnchecked, ", ")
		}
		modelCond = cond(v1alpha1.ConditionModelReady, true, v1alpha1.ReasonModelsCached, msg)
	}

	var topoCond metav1.Condition
	switch {
	case len(wakeFailing) > 0:
		topoCond = cond(v1alpha1.ConditionTopologyReady, false, v1alpha1.ReasonWakeFailing, "cannot wake: "+strings.Join(append(wakeFailing, notServing...), "; "))
	case len(notServing) == 0 && len(idle) > 0:
		topoCond = cond(v1alpha1.ConditionTopologyReady, true, v1alpha1.ReasonTopologyAvailable,
			"every replica of every awake application is ready; asleep, at zero pods or waking, their requests wait in the queue: "+strings.Join(idle, ", "))
	case len(notServing) == 0:
		topoCond = cond(v1alpha1.ConditionTopologyReady, true, v1alpha1.ReasonTopologyAvailable, "every replica of every application is ready")
	default:
		topoCond = cond(v1alpha1.ConditionTopologyReady, false, v1alpha1.ReasonTopologyStarting, strings.Join(notServing, "; "))
	}

	gwOK, gwReason, gwMsg, err := gatewayState(ctx, mo, idx, in)
	if err != nil {
		return plugin.StatusResult{}, err
	}
	gwCond := cond(v1alpha1.ConditionGatewayReady, gwOK, gwReason, gwMsg)

	allOK := modelCond.Status == metav1.ConditionTrue && topoCond.Status == metav1.ConditionTrue && gwOK
	var readyCond metav1.Condition
	if allOK {
		msg := "every application is served through the gateway"
		if len(idle) > 0 {
			msg += "; idle (asleep or at zero pods), they wake on the next request: " + strings.Join(idle, ", ")
		}
		readyCond = cond(v1alpha1.ConditionReady, true, v1alpha1.ReasonAllReady, msg)
	} else {
		var why []string
		for _, c := range []metav1.Condition{modelCond, topoCond, gwCond} {
			if c.Status != metav1.ConditionTrue {
				why = append(why, c.Type+": "+c.Message)
			}
		}
		readyCond = cond(v1alpha1.ConditionReady, false, v1alpha1.ReasonNotReady, strings.Join(why, "; "))
	}

	phase := v1alpha1.PhaseStarting
	switch {
	case allOK:
		phase = v1alpha1.PhaseReady
	case len(failed) > 0:
		phase = v1alpha1.PhaseFailed
	case len(downloading) > 0:
		phase = v1alpha1.PhaseDownloading
	case ready > 0 && ready < len(names):
		phase = v1alpha1.PhaseDegraded
	case len(notCached) == len(names):
		phase = v1alpha1.PhasePending
	}

	appsJSON, err := toPlain(apps)
	if err != nil {
		return plugin.StatusResult{}, err
	}
	conds := []metav1.Condition{modelCond, topoCond, gwCond, readyCond}
	pols := resolvePolicies(ctx, in.Reader, mo)
	sleepConds := sleepConditions(mo, apps, pols, coldS3SecretProblems(ctx, in.Reader, mo, pols), mo.Status.Conditions)
	if c := processSnapshotsCondition(mo, pols, idx.checkpoints, mo.Status.Conditions); c != nil {
		sleepConds = append(sleepConds, *c)
	}
	for _, c := range sleepConds {
		c.ObservedGeneration = gen
		conds = append(conds, c)
	}
	return plugin.StatusResult{
		Fields: map[string]any{
			"phase":             string(phase),
			"endpoint":          endpoint(mo, in.Owner, idx),
			"readyApplications": fmt.Sprintf("%d/%d", ready, len(names)),
			"modelSize":         strings.Join(sizes, "; "),
			"awakeApplications": fmt.Sprintf("%d/%d", awake, len(names)),
			"applications":      appsJSON,
		},
		Conditions: conds,
	}, nil
}

// objectIndex holds the live objects decoded, by component and
// application.
type objectIndex struct {
	jobs         []*batchv1.Job
	statefulSets []*appsv1.StatefulSet
	deployments  []*appsv1.Deployment
	configMaps   []*corev1.ConfigMap
	services     []*corev1.Service
	ingresses    []*unstructured.Unstructured
	routes       []*unstructured.Unstructured
	// checkpoints by application (spec.application), with the status the
	// lifecycle leader wrote.
	checkpoints map[string]*v1alpha1.ModelCheckpoint
}

func indexObjects(objs []*unstructured.Unstructured) (*objectIndex, error) {
	idx := &objectIndex{checkpoints: map[string]*v1alpha1.ModelCheckpoint{}}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		var into runtime.Object
		switch gvk.Group + "/" + gvk.Kind {
		case v1alpha1.GroupVersion.Group + "/ModelCheckpoint":
			c := &v1alpha1.ModelCheckpoint{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, c); err != nil {
				return nil, fmt.Errorf("decoding ModelCheckpoint %s: %w", o.GetName(), err)
			}
			idx.checkpoints[c.Spec.Application] = c
		case "batch/Job":
			j := &batchv1.Job{}
			idx.jobs, into = append(idx.jobs, j), j
		case "apps/StatefulSet":
			s := &appsv1.StatefulSet{}
			idx.statefulSets, into = append(idx.statefulSets, s), s
		case "apps/Deployment":
			d := &appsv1.Deployment{}
			idx.deployments, into = append(idx.deployments, d), d
		case "/ConfigMap":
			c := &corev1.ConfigMap{}
			idx.configMaps, into = append(idx.configMaps, c), c
		case "/Service":
			s := &corev1.Service{}
			idx.services, into = append(idx.services, s), s
		case "networking.k8s.io/Ingress":
			idx.ingresses = append(idx.ingresses, o)
		case "gateway.networking.k8s.io/HTTPRoute":
			idx.routes = append(idx.routes, o)
		}
		if into != nil {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				return nil, fmt.Errorf("decoding %s %s: %w", gvk.Kind, o.GetName(), err)
			}
		}
	}
	return idx, nil
}

func matches(meta metav1.Object, component, app string) bool {
	l := meta.GetLabels()
	return l[labelComponent] == component && (app == "" || l[labelApplication] == app)
}

func applicationStatus(name string, app v1alpha1.Application, idx *objectIndex) v1alpha1.ApplicationStatus {
	st := v1alpha1.ApplicationStatus{
		ServedModelName: app.Serving.ServedModelName,
		Replicas:        app.Scaling.Replicas,
		Workers:         app.Scaling.Replicas * app.Runtime.Workers,
	}
	st.Model = modelStatus(name, idx)

	var root *appsv1.StatefulSet
	workerGroupsReady := 0
	for _, s := range idx.statefulSets {
		switch {
		case matches(s, "root", name):
			root = s
		case hasSeat(app) && matches(s, "seat-group", "") && s.Labels[labelSeatGroup] == app.Lifecycle.Seat.Group:
			// The application's engine runs in its seat group's pods.
			root = s
		case matches(s, "worker", name):
			st.ReadyWorkers += s.Status.ReadyReplicas
			if s.Spec.Replicas != nil && s.Status.ReadyReplicas >= *s.Spec.Replicas && s.Status.ObservedGeneration >= s.Generation {
				workerGroupsReady++
			}
		}
	}
	if root != nil {
		st.ReadyReplicas = root.Status.ReadyReplicas
		if root.Status.ObservedGeneration < root.Generation {
			// The controller has not seen the latest spec yet.
			st.ReadyReplicas = min(st.ReadyReplicas, root.Status.UpdatedReplicas)
		}
	}
	if app.Runtime.Workers > 0 {
		// A replica serves only with all its workers.
		st.ReadyReplicas = min(st.ReadyReplicas, int32(workerGroupsReady))
	}
	if app.Lifecycle != nil {
		lifecycleStatus(&st, name, app, root)
		if st.Phase != "" {
			if st.Model.Phase == "Complete" {
				return st
			}
			st.Phase, st.Message = "", ""
		}
	}

	switch {
	case st.Model.Size != nil && !st.Model.Size.Fits:
		st.Phase = v1alpha1.PhaseFailed
		st.Message = "no engine pod is started: " + strings.TrimPrefix(st.Model.Message, "verification failed: ")
	case st.Model.Phase == "Failed":
		st.Phase = v1alpha1.PhaseFailed
		st.Message = "model fetch failed: " + st.Model.Message
	case st.Model.Phase != "Complete" && (st.Model.Phase == "Downloading" || st.Model.Phase == "Verifying"):
		st.Phase = v1alpha1.PhaseDownloading
		st.Message = fmt.Sprintf("model %d%% downloaded", st.Model.ProgressPercent)
	case st.Model.Phase != "Complete":
		st.Phase = v1alpha1.PhasePending
		st.Message = "waiting for the model fetch Job to start"
	case st.Replicas == 0:
		st.Phase = v1alpha1.PhaseStopped
		st.Message = "scaled to zero replicas"
	case st.ReadyReplicas >= st.Replicas:
		st.Phase = v1alpha1.PhaseReady
	case st.ReadyReplicas > 0:
		st.Phase = v1alpha1.PhaseDegraded
		st.Message = fmt.Sprintf("%d of %d replicas ready", st.ReadyReplicas, st.Replicas)
	default:
		st.Phase = v1alpha1.PhaseStarting
		st.Message = "loading the model"
	}
	return st
}

// sizeSummary is one application's part of status.modelSize, for example
// "1.1B Q8_0 1.1GiB, needs 1.4GiB (limit 1.0GiB)".
func sizeSummary(s v1alpha1.ModelSize) string {
	out := fmt.Sprintf("%s %s %s, needs %s", modelsize.Count(s.Parameters), s.WeightType, modelsize.Bytes(s.FileBytes), modelsize.Bytes(s.MemoryBytes))
	if s.GPUs > 0 {
		out += fmt.Sprintf(" + %s on each of %d GPU(s)", modelsize.Bytes(s.GPUMemoryBytes), s.GPUs)
	}
	if !s.Fits {
		var limits []string
		if s.MemoryLimitBytes > 0 {
			limits = append(limits, "limit "+modelsize.Bytes(s.MemoryLimitBytes))
		}
		if s.GPUProductMemoryBytes > 0 {
			limits = append(limits, s.GPUProduct+" "+modelsize.Bytes(s.GPUProductMemoryBytes))
		}
		out += " (" + strings.Join(limits, ", ") + ")"
	}
	return out
}

// modelStatus combines the fetcher's progress report with its Job's
// outcome; the Job wins when the report is stale (for example the fetcher
// was killed before writing its last report).
func modelStatus(app string, idx *objectIndex) v1alpha1.ModelStatus {
	ms := v1alpha1.ModelStatus{Phase: "Pending"}
	for _, cm := range idx.configMaps {
		if !matches(cm, "model-progress", app) {
			continue
		}
		raw, ok := cm.Data[progressKey]
		if !ok {
			break
		}
		var p fetchProgress
		if err := json.Unmarshal([]byte(raw), &p); err != nil {
			ms.Message = "unreadable progress report: " + err.Error()
			break
		}
		ms = v1alpha1.ModelStatus{
			Phase: p.Phase, Bytes: p.BytesDone, BytesTotal: p.BytesTotal,
			Files: p.FilesDone, FilesTotal: p.Files, ETASeconds: p.ETASeconds,
			Verified: p.Verified, Message: p.Message, Size: p.Sizing,
		}
		if ms.Phase == "" {
			ms.Phase = "Pending"
		}
	}
	for _, j := range idx.jobs {
		if !matches(j, "model-fetch", app) {
			continue
		}
		for _, c := range j.Status.Conditions {
			if c.Status != corev1.ConditionTrue {
				continue
			}
			switch c.Type {
			case batchv1.JobComplete, batchv1.JobSuccessCriteriaMet:
				ms.Phase = "Complete"
			case batchv1.JobFailed:
				ms.Phase = "Failed"
				if ms.Message == "" {
					ms.Message = c.Message
				}
			}
		}
	}
	switch {
	case ms.Phase == "Complete":
		ms.ProgressPercent = 100
	case ms.BytesTotal > 0:
		ms.ProgressPercent = int32(min(99, ms.Bytes*100/ms.BytesTotal))
	}
	return ms
}

// gatewayState reports whether requests can enter the stack: the gateway
// has ready endpoints, a dispatcher runs and the in-cluster NATS servers
// have a quorum.
func gatewayState(ctx context.Context, mo *v1alpha1.ModelOrchestra, idx *objectIndex, in plugin.StatusInput) (bool, string, string, error) {
	var gw, disp *appsv1.Deployment
	for _, d := range idx.deployments {
		switch {
		case matches(d, "gateway", ""):
			gw = d
		case matches(d, "dispatcher", ""):
			disp = d
		}
	}
	if gw == nil || gw.Status.ReadyReplicas == 0 {
		return false, v1alpha1.ReasonGatewayUnavailable, "no gateway replica is ready", nil
	}
	if in.Reader != nil {
		n, err := readyEndpoints(ctx, in.Reader, gw.Namespace, gw.Name)
		if err != nil {
			return false, "", "", err
		}
		if n == 0 {
			return false, v1alpha1.ReasonGatewayUnavailable, fmt.Sprintf("Service %s has no ready endpoints", gw.Name), nil
		}
	}
	if disp == nil || disp.Status.ReadyReplicas == 0 {
		return false, v1alpha1.ReasonQueueUnavailable, "no dispatcher replica is ready", nil
	}
	if mo.Spec.NATS.URL == "" {
		var nats *appsv1.StatefulSet
		for _, s := range idx.statefulSets {
			if matches(s, "nats", "") {
				nats = s
			}
		}
		quorum := mo.Spec.NATS.Replicas/2 + 1
		if nats == nil || nats.Status.ReadyReplicas < quorum {
			have := int32(0)
			if nats != nil {
				have = nats.Status.ReadyReplicas
			}
			return false, v1alpha1.ReasonQueueUnavailable, fmt.Sprintf("%d of %d NATS servers ready, %d needed", have, mo.Spec.NATS.Replicas, quorum), nil
		}
	}
	return true, v1alpha1.ReasonGatewayAvailable, fmt.Sprintf("%d gateway replicas ready", gw.Status.ReadyReplicas), nil
}

// readyEndpoints counts the ready endpoints of a Service.
func readyEndpoints(ctx context.Context, r client.Reader, ns, service string) (int, error) {
	var slices discoveryv1.EndpointSliceList
	if err := r.List(ctx, &slices, client.InNamespace(ns), client.MatchingLabels{discoveryv1.LabelServiceName: service}); err != nil {
		return 0, fmt.Errorf("listing EndpointSlices of Service %s/%s: %w", ns, service, err)
	}
	n := 0
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready == nil || *e.Conditions.Ready {
				n++
			}
		}
	}
	return n, nil
}

// endpoint is the OpenAI base URL clients should use: the Ingress or
// HTTPRoute host when there is one, else a load balancer address, else the
// in-cluster Service.
func endpoint(mo *v1alpha1.ModelOrchestra, owner *unstructured.Unstructured, idx *objectIndex) string {
	g := mo.Spec.Gateway
	if in := g.Ingress; in != nil && in.Host != "" {
		scheme := "http"
		if in.TLSSecretName != "" {
			scheme = "https"
		}
		return scheme + "://" + in.Host + joinURLPath(in.Path, "v1")
	}
	if r := g.HTTPRoute; r != nil && len(r.Hostnames) > 0 {
		return "http://" + r.Hostnames[0] + joinURLPath(r.Path, "v1")
	}
	name := owner.GetName() + "-gateway"
	for _, s := range idx.services {
		if s.Name != name || s.Spec.Type != corev1.ServiceTypeLoadBalancer {
			continue
		}
		for _, ing := range s.Status.LoadBalancer.Ingress {
			host := ing.Hostname
			if host == "" {
				host = ing.IP
			}
			if host != "" {
				return fmt.Sprintf("http://%s:%d/v1", host, g.Service.Port)
			}
		}
	}
	return fmt.Sprintf("http://%s.%s.svc:%d/v1", name, owner.GetNamespace(), g.Service.Port)
}

func joinURLPath(prefix, p string) string {
	return strings.TrimSuffix(prefix, "/") + "/" + p
}

func toPlain(v any) (map[string]any, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding status: %w", err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("encoding status: %w", err)
	}
	return out, nil
}
