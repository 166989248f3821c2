package orchestra

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/model-orchestra/operator/internal/plugin"
)

// GPUSchedulingName is the gpu-scheduling post-renderer's name.
const GPUSchedulingName = "gpu-scheduling"

// Pod template annotations the chart sets on engine pods that need GPUs:
// the contract between the chart (charts/model-orchestra/charts/topology/
// templates/topology.yaml, where it is documented next to them) and this
// post-renderer. The chart states what a pod needs; the cluster's policy
// (resource name, product label, tolerations) stays out of the chart values,
// in this post-renderer's config in watches.yaml. Without this post-renderer
// the chart's GPU pods request no GPU.
const (
	// AnnotationGPUCount is the number of GPUs per pod.
	AnnotationGPUCount = "modelorchestra.io/gpu-count"
	// AnnotationGPUProduct is the GPU product the pod must run on.
	AnnotationGPUProduct = "modelorchestra.io/gpu-product"
	// AnnotationGPUContainer names the container that gets the GPUs;
	// without it the first container does.
	AnnotationGPUContainer = "modelorchestra.io/gpu-container"
)

// GPUSchedulingConfig is the gpu-scheduling config in watches.yaml.
type GPUSchedulingConfig struct {
	// ResourceName is the extended resource a GPU is requested as.
	ResourceName string `json:"resourceName,omitempty"`
	// ProductLabel is the node label holding the GPU product name (set by
	// GPU feature discovery).
	ProductLabel string `json:"productLabel,omitempty"`
	// Tolerations are added to GPU pods, so that they may run on tainted
	// GPU nodes.
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
}

// gpuScheduling turns the chart's GPU annotations into resources, a node
// selector and tolerations, so that the chart stays free of vendor details
// and the same rules apply to every engine.
type gpuScheduling struct {
	cfg GPUSchedulingConfig
}

// NewGPUScheduling builds the gpu-scheduling post-renderer from its config.
func NewGPUScheduling(config json.RawMessage) (plugin.PostRenderer, error) {
	cfg := GPUSchedulingConfig{ResourceName: "nvidia.com/gpu", ProductLabel: "nvidia.com/gpu.product"}
	if err := decodeConfig(GPUSchedulingName, config, &cfg); err != nil {
		return nil, err
	}
	if cfg.Tolerations == nil {
		// Set after decoding: decoding into a filled slice would merge the
		// configured tolerations into the default's fields. An explicit
		// empty list means none.
		cfg.Tolerations = []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	}
	if errs := validation.IsQualifiedName(cfg.ResourceName); len(errs) > 0 || !strings.Contains(cfg.ResourceName, "/") {
		return nil, fmt.Errorf("post-renderer %s: config: resourceName %q must be a domain-qualified extended resource name such as nvidia.com/gpu", GPUSchedulingName, cfg.ResourceName)
	}
	if errs := validation.IsQualifiedName(cfg.ProductLabel); len(errs) > 0 {
		return nil, fmt.Errorf("post-renderer %s: config: productLabel %q is not a label key: %s", GPUSchedulingName, cfg.ProductLabel, strings.Join(errs, "; "))
	}
	return &gpuScheduling{cfg: cfg}, nil
}

// PostRender implements plugin.PostRenderer.
func (g *gpuScheduling) PostRender(_ context.Context, _ plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	for _, obj := range objs {
		pt, err := podTemplateOf(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", GPUSchedulingName, err)
		}
		if pt == nil {
			continue
		}
		countText, ok := pt.tmpl.Annotations[AnnotationGPUCount]
		if !ok {
			continue
		}
		if err := g.apply(pt, countText); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", GPUSchedulingName, pt.describe(), err)
		}
		if err := pt.store(); err != nil {
			return nil, fmt.Errorf("%s: %w", GPUSchedulingName, err)
		}
	}
	return objs, nil
}

func (g *gpuScheduling) apply(pt *podTemplate, countText string) error {
	count, err := strconv.Atoi(countText)
	if err != nil || count < 1 {
		return fmt.Errorf("annotation %s: %q is not a positive number of GPUs", AnnotationGPUCount, countText)
	}
	spec := &pt.tmpl.Spec
	if len(spec.Containers) == 0 {
		return fmt.Errorf("no containers to give GPUs to")
	}
	c := &spec.Containers[0]
	if name := pt.tmpl.Annotations[AnnotationGPUContainer]; name != "" {
		c = nil
		for i := range spec.Containers {
			if spec.Containers[i].Name == name {
				c = &spec.Containers[i]
			}
		}
		if c == nil {
			return fmt.Errorf("annotation %s names container %q, which the pod does not have", AnnotationGPUContainer, name)
		}
	}
	// Extended resources cannot be overcommitted: request equals limit.
	q := *resource.NewQuantity(int64(count), resource.DecimalSI)
	res := corev1.ResourceName(g.cfg.ResourceName)
	if c.Resources.Limits == nil {
		c.Resources.Limits = corev1.ResourceList{}
	}
	if c.Resources.Requests == nil {
		c.Resources.Requests = corev1.ResourceList{}
	}
	c.Resources.Limits[res] = q
	c.Resources.Requests[res] = q

	if product := pt.tmpl.Annotations[AnnotationGPUProduct]; product != "" {
		if spec.NodeSelector == nil {
			spec.NodeSelector = map[string]string{}
		}
		if have, set := spec.NodeSelector[g.cfg.ProductLabel]; set && have != product {
			return fmt.Errorf("nodeSelector %s=%s contradicts gpu.product %s", g.cfg.ProductLabel, have, product)
		}
		spec.NodeSelector[g.cfg.ProductLabel] = product
	}
	for _, want := range g.cfg.Tolerations {
		present := false
		for _, have := range spec.Tolerations {
			if equality.Semantic.DeepEqual(have, want) {
				present = true
				break
			}
		}
		if !present {
			spec.Tolerations = append(spec.Tolerations, want)
		}
	}
	return nil
}
