package orchestra

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/plugin"
)

func gpuPod(annotations map[string]string, containers ...corev1.Container) corev1.PodTemplateSpec {
	p := pod(containers...)
	p.ObjectMeta = metav1.ObjectMeta{Annotations: annotations}
	return p
}

func TestGPUScheduling(t *testing.T) {
	nvidiaToleration := corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}
	two := resource.MustParse("2")
	cases := []struct {
		name    string
		config  string
		tmpl    corev1.PodTemplateSpec
		check   func(t *testing.T, got corev1.PodTemplateSpec)
		wantErr string
	}{
		{
			name: "count and product become resources, node selector and toleration",
			tmpl: gpuPod(map[string]string{AnnotationGPUCount: "2", AnnotationGPUProduct: "NVIDIA-A100", AnnotationGPUContainer: "engine"},
				corev1.Container{Name: "sidecar"}, corev1.Container{Name: "engine"}),
			check: func(t *testing.T, got corev1.PodTemplateSpec) {
				engine := got.Spec.Containers[1]
				if q := engine.Resources.Limits["nvidia.com/gpu"]; q.Cmp(two) != 0 {
					t.Errorf("limit = %s, want 2", q.String())
				}
				if q := engine.Resources.Requests["nvidia.com/gpu"]; q.Cmp(two) != 0 {
					t.Errorf("request = %s, want 2", q.String())
				}
				if len(got.Spec.Containers[0].Resources.Limits) != 0 {
					t.Errorf("the sidecar got GPUs: %v", got.Spec.Containers[0].Resources.Limits)
				}
				if diff := cmp.Diff(map[string]string{"nvidia.com/gpu.product": "NVIDIA-A100"}, got.Spec.NodeSelector); diff != "" {
					t.Errorf("nodeSelector (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff([]corev1.Toleration{nvidiaToleration}, got.Spec.Tolerations); diff != "" {
					t.Errorf("tolerations (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "without product the pod may run on any GPU node",
			tmpl: gpuPod(map[string]string{AnnotationGPUCount: "1"}, corev1.Container{Name: "engine"}),
			check: func(t *testing.T, got corev1.PodTemplateSpec) {
				if len(got.Spec.NodeSelector) != 0 {
					t.Errorf("nodeSelector = %v, want none", got.Spec.NodeSelector)
				}
				if _, ok := got.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; !ok {
					t.Error("first container got no GPU")
				}
			},
		},
		{
			name: "a toleration already present is not repeated",
			tmpl: func() corev1.PodTemplateSpec {
				p := gpuPod(map[string]string{AnnotationGPUCount: "1"}, corev1.Container{Name: "engine"})
				p.Spec.Tolerations = []corev1.Toleration{nvidiaToleration}
				return p
			}(),
			check: func(t *testing.T, got corev1.PodTemplateSpec) {
				if len(got.Spec.Tolerations) != 1 {
					t.Errorf("tolerations = %v, want exactly one", got.Spec.Tolerations)
				}
			},
		},
		{
			name:   "configured resource and label for another vendor",
			config: `{"resourceName":"amd.com/gpu","productLabel":"amd.com/gpu.product-name","tolerations":[]}`,
			tmpl:   gpuPod(map[string]string{AnnotationGPUCount: "1", AnnotationGPUProduct: "MI300X"}, corev1.Container{Name: "engine"}),
			check: func(t *testing.T, got corev1.PodTemplateSpec) {
				if _, ok := got.Spec.Containers[0].Resources.Limits["amd.com/gpu"]; !ok {
					t.Error("no amd.com/gpu limit")
				}
				if got.Spec.NodeSelector["amd.com/gpu.product-name"] != "MI300X" {
					t.Errorf("nodeSelector = %v", got.Spec.NodeSelector)
				}
				if len(got.Spec.Tolerations) != 0 {
					t.Errorf("tolerations = %v, want none", got.Spec.Tolerations)
				}
			},
		},
		{
			name:   "configured tolerations replace the default",
			config: `{"tolerations":[{"key":"gpu","operator":"Equal","value":"a100","effect":"NoExecute"}]}`,
			tmpl:   gpuPod(map[string]string{AnnotationGPUCount: "1"}, corev1.Container{Name: "engine"}),
			check: func(t *testing.T, got corev1.PodTemplateSpec) {
				want := []corev1.Toleration{{Key: "gpu", Operator: corev1.TolerationOpEqual, Value: "a100", Effect: corev1.TaintEffectNoExecute}}
				if diff := cmp.Diff(want, got.Spec.Tolerations); diff != "" {
					t.Errorf("tolerations (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "pods without the annotation are untouched",
			tmpl: pod(corev1.Container{Name: "gateway"}),
			check: func(t *testing.T, got corev1.PodTemplateSpec) {
				if diff := cmp.Diff(pod(corev1.Container{Name: "gateway"}), got); diff != "" {
					t.Errorf("changed (-want +got):\n%s", diff)
				}
			},
		},
		{
			name: "a node selector for another product is a contradiction",
			tmpl: func() corev1.PodTemplateSpec {
				p := gpuPod(map[string]string{AnnotationGPUCount: "1", AnnotationGPUProduct: "NVIDIA-L4"}, corev1.Container{Name: "engine"})
				p.Spec.NodeSelector = map[string]string{"nvidia.com/gpu.product": "NVIDIA-T4"}
				return p
			}(),
			wantErr: "StatefulSet engine: nodeSelector nvidia.com/gpu.product=NVIDIA-T4 contradicts gpu.product NVIDIA-L4",
		},
		{
			name:    "zero GPUs is refused",
			tmpl:    gpuPod(map[string]string{AnnotationGPUCount: "0"}, corev1.Container{Name: "engine"}),
			wantErr: `"0" is not a positive number of GPUs`,
		},
		{
			name:    "an unknown container is refused",
			tmpl:    gpuPod(map[string]string{AnnotationGPUCount: "1", AnnotationGPUContainer: "model"}, corev1.Container{Name: "engine"}),
			wantErr: `names container "model", which the pod does not have`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := NewGPUScheduling(json.RawMessage(tc.config))
			if err != nil {
				t.Fatal(err)
			}
			obj := workload(t, "StatefulSet", "engine", tc.tmpl)
			out, err := pr.PostRender(context.Background(), plugin.RenderContext{}, []*unstructuredT{obj})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, template(t, out[0]))
		})
	}
}

func TestGPUSchedulingConfig(t *testing.T) {
	for _, tc := range []struct{ config, wantErr string }{
		{`{"resourceName":"gpu"}`, "must be a domain-qualified extended resource name"},
		{`{"productLabel":"not a label"}`, "is not a label key"},
		{`{"resource":"nvidia.com/gpu"}`, `unknown field "resource"`},
	} {
		if _, err := NewGPUScheduling(json.RawMessage(tc.config)); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("config %s: error = %v, want one containing %q", tc.config, err, tc.wantErr)
		}
	}
}

// TestGPUSchedulingIsIdempotent runs the renderer twice: the engine may
// post-render output that already went through it.
func TestGPUSchedulingIsIdempotent(t *testing.T) {
	pr, err := NewGPUScheduling(nil)
	if err != nil {
		t.Fatal(err)
	}
	obj := workload(t, "StatefulSet", "engine", gpuPod(map[string]string{AnnotationGPUCount: "1", AnnotationGPUProduct: "NVIDIA-L4"}, corev1.Container{Name: "engine"}))
	once, err := pr.PostRender(context.Background(), plugin.RenderContext{}, []*unstructuredT{obj})
	if err != nil {
		t.Fatal(err)
	}
	first := once[0].DeepCopy()
	twice, err := pr.PostRender(context.Background(), plugin.RenderContext{}, once)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first.Object, twice[0].Object); diff != "" {
		t.Errorf("second run changed the object (-first +second):\n%s", diff)
	}
}
