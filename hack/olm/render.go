package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"helm.sh/helm/v3/pkg/chartutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/orchestra"
	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/render"
	"github.com/model-orchestra/operator/internal/watches"
)

// chartRenderer renders a custom resource exactly as the operator would:
// watches.yaml, the registered plugins and the shared render pipeline.
type chartRenderer struct {
	root string
	// kubeVersion is the Kubernetes version to render for: the CSV's
	// minKubeVersion, the oldest cluster the bundle installs on.
	kubeVersion string
}

// Render sets the operator's environment (the RELATED_IMAGE_* variables the
// values translator reads), loads watches.yaml and renders cr offline. A
// kind that watches.yaml does not serve renders nothing: the operator only
// reads it (a CheckpointPolicy, read by the values translator).
func (c chartRenderer) Render(ctx context.Context, cr *unstructured.Unstructured, env map[string]string) ([]*unstructured.Unstructured, error) {
	for k, v := range env {
		if err := os.Setenv(k, v); err != nil {
			return nil, err
		}
	}
	reg := plugin.NewRegistry()
	orchestra.Register(reg)
	entries, err := watches.Load(filepath.Join(c.root, "watches.yaml"), os.DirFS(c.root), reg)
	if err != nil {
		return nil, err
	}
	for i := range entries {
		e := &entries[i]
		if e.GVK != cr.GroupVersionKind() {
			continue
		}
		obj := cr.DeepCopy()
		if obj.GetNamespace() == "" {
			obj.SetNamespace("default")
		}
		opts := render.Options{}
		if c.kubeVersion != "" {
			kv, err := chartutil.ParseKubeVersion(c.kubeVersion)
			if err != nil {
				return nil, fmt.Errorf("kube version %q: %w", c.kubeVersion, err)
			}
			opts.KubeVersion = kv
		}
		res, err := render.ForResource(ctx, e, obj, opts)
		if err != nil {
			return nil, err
		}
		return res.Objects, nil
	}
	return nil, nil
}

// imageDefaults returns the RELATED_IMAGE_* variables the operator reads and
// their defaults.
func imageDefaults() map[string]string {
	out := map[string]string{}
	for _, img := range orchestra.Images() {
		out[img.Env] = img.Default
	}
	return out
}

// minKubeVersion reads spec.minKubeVersion from the CSV base.
func minKubeVersion(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	var base struct {
		Spec struct {
			MinKubeVersion string `json:"minKubeVersion"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(data, &base); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return base.Spec.MinKubeVersion, nil
}
