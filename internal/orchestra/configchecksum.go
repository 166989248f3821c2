package orchestra

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/plugin"
)

// ConfigChecksumName is the config-checksum post-renderer's name.
const ConfigChecksumName = "config-checksum"

// DefaultChecksumAnnotation is the pod template annotation holding the
// checksum.
const DefaultChecksumAnnotation = "modelorchestra.io/config-checksum"

// ConfigChecksumConfig is the config-checksum config in watches.yaml.
type ConfigChecksumConfig struct {
	// Annotation is the pod template annotation to write.
	Annotation string `json:"annotation,omitempty"`
}

// configChecksum makes pods roll when their configuration changes: it
// annotates every long-running pod template (Deployment, StatefulSet,
// DaemonSet) with a digest of the ConfigMaps and Secrets it references.
// Rendered ones are hashed from the manifest; others (a user's Secret, for
// example an API key or NATS credentials) are read through the render
// context's Reader, when there is one. Jobs are left alone: their pod
// templates are immutable.
//
// Only the digest of a Secret's data is recorded, never its content.
//
// It is a plugin.DigestContributor: it names the ConfigMaps and Secrets it
// reads live, so that the engine upgrades the release, and the pods roll,
// when one of them changes.
type configChecksum struct {
	annotation string
}

// NewConfigChecksum builds the config-checksum post-renderer.
func NewConfigChecksum(config json.RawMessage) (plugin.PostRenderer, error) {
	cfg := ConfigChecksumConfig{Annotation: DefaultChecksumAnnotation}
	if err := decodeConfig(ConfigChecksumName, config, &cfg); err != nil {
		return nil, err
	}
	if errs := validation.IsQualifiedName(cfg.Annotation); len(errs) > 0 {
		return nil, fmt.Errorf("post-renderer %s: config: annotation %q is not a valid annotation key", ConfigChecksumName, cfg.Annotation)
	}
	return &configChecksum{annotation: cfg.Annotation}, nil
}

// rolledKinds are the workloads whose pods are replaced when their
// template changes.
var rolledKinds = map[string]bool{"apps/Deployment": true, "apps/StatefulSet": true, "apps/DaemonSet": true}

type configRef struct {
	kind string // ConfigMap or Secret
	name string
}

// rolled is the pod template of a rolled workload and the ConfigMaps and
// Secrets it references.
type rolled struct {
	pt *podTemplate
	// namespace is the workload's, or the owner's when the chart left it out.
	namespace string
	refs      []configRef
}

// rolledTemplates lists the pod templates of the workloads in objs whose
// pods are replaced when their template changes, with what each
// references. PostRender and DigestInputs both walk this list, so that they
// agree on what is read.
func rolledTemplates(rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]rolled, error) {
	var out []rolled
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		if !rolledKinds[gvk.Group+"/"+gvk.Kind] {
			continue
		}
		pt, err := podTemplateOf(obj)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ConfigChecksumName, err)
		}
		ns := obj.GetNamespace()
		if ns == "" && rc.Owner != nil {
			ns = rc.Owner.GetNamespace()
		}
		out = append(out, rolled{pt: pt, namespace: ns, refs: referencedConfig(&pt.tmpl.Spec)})
	}
	return out, nil
}

// renderedConfig indexes the ConfigMaps and Secrets that objs render.
func renderedConfig(objs []*unstructured.Unstructured) map[configRef]*unstructured.Unstructured {
	rendered := map[configRef]*unstructured.Unstructured{}
	for _, o := range objs {
		if o.GetAPIVersion() == "v1" && (o.GetKind() == "ConfigMap" || o.GetKind() == "Secret") {
			rendered[configRef{o.GetKind(), o.GetName()}] = o
		}
	}
	return rendered
}

// PostRender implements plugin.PostRenderer.
func (c *configChecksum) PostRender(ctx context.Context, rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	rendered := renderedConfig(objs)
	workloads, err := rolledTemplates(rc, objs)
	if err != nil {
		return nil, err
	}
	for _, w := range workloads {
		if len(w.refs) == 0 {
			continue
		}
		h := sha256.New()
		for _, ref := range w.refs {
			data, err := c.content(ctx, rc.Reader, rendered, w.namespace, ref)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", ConfigChecksumName, w.pt.describe(), err)
			}
			_, _ = fmt.Fprintf(h, "%s/%s\n", ref.kind, ref.name) // hash writes never fail
			h.Write(data)
			h.Write([]byte{'\n'})
		}
		if w.pt.tmpl.Annotations == nil {
			w.pt.tmpl.Annotations = map[string]string{}
		}
		w.pt.tmpl.Annotations[c.annotation] = hex.EncodeToString(h.Sum(nil))
		if err := w.pt.store(); err != nil {
			return nil, fmt.Errorf("%s: %w", ConfigChecksumName, err)
		}
	}
	return objs, nil
}

// DigestInputs implements plugin.DigestContributor: the ConfigMaps and
// Secrets that the rolled workloads of objs reference and objs do not
// render, which PostRender reads live. It reads nothing itself.
func (c *configChecksum) DigestInputs(_ context.Context, rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]plugin.ObjectRef, error) {
	rendered := renderedConfig(objs)
	workloads, err := rolledTemplates(rc, objs)
	if err != nil {
		return nil, err
	}
	seen := map[plugin.ObjectRef]bool{}
	var out []plugin.ObjectRef
	for _, w := range workloads {
		for _, ref := range w.refs {
			if rendered[ref] != nil {
				continue
			}
			r := plugin.ObjectRef{GVK: corev1.SchemeGroupVersion.WithKind(ref.kind), Namespace: w.namespace, Name: ref.name}
			if !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// content returns the canonical bytes of what a reference points to.
func (c *configChecksum) content(ctx context.Context, reader client.Reader, rendered map[configRef]*unstructured.Unstructured, ns string, ref configRef) ([]byte, error) {
	if o, ok := rendered[ref]; ok {
		return canonicalData(o.Object["data"], o.Object["binaryData"], o.Object["stringData"])
	}
	if reader == nil {
		// Offline preview: the live object is unknown, and a constant keeps
		// the preview deterministic.
		return []byte("external"), nil
	}
	key := client.ObjectKey{Namespace: ns, Name: ref.name}
	switch ref.kind {
	case "Secret":
		var s corev1.Secret
		if err := reader.Get(ctx, key, &s); err != nil {
			if apierrors.IsNotFound(err) {
				return []byte("absent"), nil
			}
			return nil, fmt.Errorf("reading Secret %s/%s: %w", ns, ref.name, err)
		}
		return canonicalData(s.Data, nil, nil)
	default:
		var cm corev1.ConfigMap
		if err := reader.Get(ctx, key, &cm); err != nil {
			if apierrors.IsNotFound(err) {
				return []byte("absent"), nil
			}
			return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", ns, ref.name, err)
		}
		return canonicalData(cm.Data, cm.BinaryData, nil)
	}
}

// canonicalData encodes data maps deterministically (encoding/json sorts
// map keys).
func canonicalData(parts ...any) ([]byte, error) {
	b, err := json.Marshal(parts)
	if err != nil {
		return nil, fmt.Errorf("encoding configuration data: %w", err)
	}
	return b, nil
}

// referencedConfig lists the ConfigMaps and Secrets a pod uses, sorted and
// without duplicates. Optional references count too: creating one changes
// the pod's configuration.
func referencedConfig(spec *corev1.PodSpec) []configRef {
	set := map[configRef]bool{}
	add := func(kind, name string) {
		if name != "" {
			set[configRef{kind, name}] = true
		}
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil {
			add("ConfigMap", v.ConfigMap.Name)
		}
		if v.Secret != nil {
			add("Secret", v.Secret.SecretName)
		}
		if v.Projected != nil {
			for _, s := range v.Projected.Sources {
				if s.ConfigMap != nil {
					add("ConfigMap", s.ConfigMap.Name)
				}
				if s.Secret != nil {
					add("Secret", s.Secret.Name)
				}
			}
		}
	}
	containers := append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...)
	for _, c := range containers {
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				add("ConfigMap", r.Name)
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				add("Secret", r.Name)
			}
		}
		for _, e := range c.EnvFrom {
			if e.ConfigMapRef != nil {
				add("ConfigMap", e.ConfigMapRef.Name)
			}
			if e.SecretRef != nil {
				add("Secret", e.SecretRef.Name)
			}
		}
	}
	refs := make([]configRef, 0, len(set))
	for r := range set {
		refs = append(refs, r)
	}
	sort.Slice(refs, func(i, j int) bool {
		if refs[i].kind != refs[j].kind {
			return refs[i].kind < refs[j].kind
		}
		return refs[i].name < refs[j].name
	})
	return refs
}
