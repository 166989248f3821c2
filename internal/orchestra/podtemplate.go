package orchestra

import (
	"bytes"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// podTemplatePaths are where the workload kinds keep their pod template.
var podTemplatePaths = map[string][]string{
	"apps/Deployment":  {"spec", "template"},
	"apps/StatefulSet": {"spec", "template"},
	"apps/DaemonSet":   {"spec", "template"},
	"apps/ReplicaSet":  {"spec", "template"},
	"batch/Job":        {"spec", "template"},
	"batch/CronJob":    {"spec", "jobTemplate", "spec", "template"},
}

// podTemplate is the pod template of a rendered workload, decoded.
type podTemplate struct {
	obj  *unstructured.Unstructured
	path []string
	tmpl corev1.PodTemplateSpec
}

// podTemplateOf returns the pod template of obj, or nil when obj is not a
// workload. A malformed template is an error naming the object.
func podTemplateOf(obj *unstructured.Unstructured) (*podTemplate, error) {
	gvk := obj.GroupVersionKind()
	path, ok := podTemplatePaths[gvk.Group+"/"+gvk.Kind]
	if !ok {
		return nil, nil
	}
	raw, found, err := unstructured.NestedMap(obj.Object, path...)
	if err != nil || !found {
		return nil, fmt.Errorf("%s %s: no pod template at .%s", gvk.Kind, obj.GetName(), joinPath(path))
	}
	pt := &podTemplate{obj: obj, path: path}
	if err := decodeStrict(raw, &pt.tmpl); err != nil {
		return nil, fmt.Errorf("%s %s: pod template: %w", gvk.Kind, obj.GetName(), err)
	}
	return pt, nil
}

// store writes the (changed) template back into its object.
func (pt *podTemplate) store() error {
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&pt.tmpl)
	if err != nil {
		return fmt.Errorf("%s %s: encoding pod template: %w", pt.obj.GetKind(), pt.obj.GetName(), err)
	}
	// The converter writes "creationTimestamp: null"; the chart never does.
	if md, ok := raw["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
		if len(md) == 0 {
			delete(raw, "metadata")
		}
	}
	return unstructured.SetNestedMap(pt.obj.Object, raw, pt.path...)
}

func (pt *podTemplate) describe() string {
	return pt.obj.GetKind() + " " + pt.obj.GetName()
}

func decodeStrict(raw map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(raw, into, true)
}

// decodeConfig decodes a post-renderer's watches.yaml config strictly;
// nil or null config leaves into unchanged.
func decodeConfig(name string, config json.RawMessage, into any) error {
	if len(bytes.TrimSpace(config)) == 0 || string(bytes.TrimSpace(config)) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(config))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("post-renderer %s: config: %w", name, err)
	}
	return nil
}

func joinPath(p []string) string {
	var b bytes.Buffer
	for i, s := range p {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	return b.String()
}
