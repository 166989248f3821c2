package render

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"helm.sh/helm/v3/pkg/postrender"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/plugin"
	"github.com/model-orchestra/operator/internal/watches"
)

// Labels and annotations set by the built-in post-renderers.
const (
	LabelName      = "app.kubernetes.io/name"
	LabelInstance  = "app.kubernetes.io/instance"
	LabelVersion   = "app.kubernetes.io/version"
	LabelComponent = "app.kubernetes.io/component"
	LabelManagedBy = "app.kubernetes.io/managed-by"

	// ManagedBy is the value of LabelManagedBy on every rendered object.
	// Helm requires it on the objects of a release (it refuses to adopt
	// objects without it) and overwrites any other value when it applies
	// them, so the preview shows what the cluster will hold.
	ManagedBy = "Helm"

	// AnnotationOwner ("<namespace>/<name>", or "<name>" for a
	// cluster-scoped owner) and AnnotationOwnerKind ("<Kind>.<group>") mark
	// the owner of an object that cannot carry an owner reference to it: a
	// cluster-scoped object, or one in another namespace.
	AnnotationOwner     = "modelorchestra.io/owner"
	AnnotationOwnerKind = "modelorchestra.io/owner-kind"

	// resourcePolicyAnnotation "keep" makes Helm leave an object behind on
	// uninstall; such objects get no owner reference, so that the garbage
	// collector keeps them too.
	resourcePolicyAnnotation = "helm.sh/resource-policy"
)

// NewPostRenderer returns the Helm post-renderer that runs the entry's
// post-renderers in order and then the built-ins, for the custom resource
// obj. The operator passes it to Helm's install and upgrade actions.
func NewPostRenderer(ctx context.Context, entry *watches.Entry, obj *unstructured.Unstructured, opts Options) postrender.PostRenderer {
	return &chain{ctx: ctx, entry: entry, owner: obj, opts: opts}
}

type chain struct {
	ctx   context.Context
	entry *watches.Entry
	owner *unstructured.Unstructured
	opts  Options
	objs  []*unstructured.Unstructured // the output of the last Run
}

func (c *chain) Run(in *bytes.Buffer) (*bytes.Buffer, error) {
	objs, err := ParseManifest(in.String())
	if err != nil {
		return nil, err
	}
	rc := plugin.RenderContext{Owner: c.owner.DeepCopy(), Reader: c.opts.Reader}
	for _, pr := range c.entry.PostRenderers {
		objs, err = pr.Renderer.PostRender(c.ctx, rc, objs)
		if err != nil {
			return nil, fmt.Errorf("post-renderer %q: %w", pr.Name, err)
		}
	}
	for _, o := range objs {
		if o == nil {
			return nil, errors.New("a post-renderer returned a nil object")
		}
		setStandardLabels(o, c.entry, c.owner)
		setOwnership(o, c.owner, c.opts.Mapper)
	}
	out, err := FormatManifest(objs)
	if err != nil {
		return nil, err
	}
	c.objs = objs
	return bytes.NewBufferString(out), nil
}

// Objects returns the objects of the manifest the last Run returned, or nil
// before a Run succeeded. They are the chain's own: read them, never change
// them.
func (c *chain) Objects() []*unstructured.Unstructured { return c.objs }

// ParseManifest splits a multi-document YAML manifest into objects. Empty
// documents are skipped; a List is expanded into its items.
func ParseManifest(manifest string) ([]*unstructured.Unstructured, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifest)))
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("reading manifest document %d: %w", i, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("parsing manifest document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("parsing manifest document %d: %w", i, err)
			}
			for j := range list.Items {
				objs = append(objs, &list.Items[j])
			}
			continue
		}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("manifest document %d has no apiVersion or kind", i)
		}
		objs = append(objs, u)
	}
}

// FormatManifest writes objects as a multi-document YAML manifest, with keys
// sorted, so that the same objects always give the same text.
func FormatManifest(objs []*unstructured.Unstructured) (string, error) {
	var b strings.Builder
	for _, o := range objs {
		y, err := yaml.Marshal(o.Object)
		if err != nil {
			return "", fmt.Errorf("encoding %s %s: %w", o.GetKind(), o.GetName(), err)
		}
		b.WriteString("---\n")
		b.Write(y)
	}
	return b.String(), nil
}

// setStandardLabels sets the app.kubernetes.io labels. instance and
// managed-by are always the engine's; name, version and component are kept
// when the chart sets them, and otherwise name is the chart name and version
// the chart's appVersion (or version). component is never invented.
func setStandardLabels(o *unstructured.Unstructured, entry *watches.Entry, owner *unstructured.Unstructured) {
	l := o.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[LabelInstance] = owner.GetName()
	l[LabelManagedBy] = ManagedBy
	if l[LabelName] == "" {
		l[LabelName] = entry.Chart.Name()
	}
	if l[LabelVersion] == "" {
		v := entry.Chart.Metadata.AppVersion
		if v == "" {
			v = entry.Chart.Metadata.Version
		}
		if v = labelValue(v); v != "" {
			l[LabelVersion] = v
		}
	}
	o.SetLabels(l)
}

// labelValue makes v a valid label value, or "" when it cannot be.
func labelValue(v string) string {
	v = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		case r == '+':
			return '_'
		default:
			return -1
		}
	}, v)
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "-_.")
}

// setOwnership makes owner the controller owner of o when Kubernetes allows
// it (o namespaced in owner's namespace, or owner cluster-scoped), and marks
// o with owner annotations otherwise.
func setOwnership(o, owner *unstructured.Unstructured, mapper meta.RESTMapper) {
	if o.GetAnnotations()[resourcePolicyAnnotation] == "keep" {
		return
	}
	gvk := o.GroupVersionKind()
	namespaced := isNamespaced(gvk, mapper)
	ownerNS := owner.GetNamespace()
	if ownerNS == "" || (namespaced && (o.GetNamespace() == "" || o.GetNamespace() == ownerNS)) {
		ref := metav1.OwnerReference{
			APIVersion:         owner.GetAPIVersion(),
			Kind:               owner.GetKind(),
			Name:               owner.GetName(),
			UID:                owner.GetUID(),
			Controller:         ptr(true),
			BlockOwnerDeletion: ptr(true),
		}
		refs := o.GetOwnerReferences()
		kept := refs[:0]
		for _, r := range refs {
			if r.Controller != nil && *r.Controller {
				continue // ours replaces any other controller reference
			}
			kept = append(kept, r)
		}
		o.SetOwnerReferences(append(kept, ref))
		return
	}
	a := o.GetAnnotations()
	if a == nil {
		a = map[string]string{}
	}
	a[AnnotationOwner] = ownerNS + "/" + owner.GetName()
	ogvk := owner.GroupVersionKind()
	a[AnnotationOwnerKind] = ogvk.GroupKind().String()
	o.SetAnnotations(a)
}

func isNamespaced(gvk schema.GroupVersionKind, mapper meta.RESTMapper) bool {
	if mapper != nil {
		if m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err == nil {
			return m.Scope.Name() == meta.RESTScopeNameNamespace
		}
	}
	return !clusterScoped[gvk.GroupKind()]
}

// clusterScoped are the well-known cluster-scoped kinds, used when no REST
// mapper is available (offline) or it does not know a kind yet.
var clusterScoped = map[schema.GroupKind]bool{
	{Kind: "Namespace"}:        true,
	{Kind: "Node"}:             true,
	{Kind: "PersistentVolume"}: true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:                         true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}:                  true,
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:                 true,
	{Group: "storage.k8s.io", Kind: "StorageClass"}:                                   true,
	{Group: "storage.k8s.io", Kind: "CSIDriver"}:                                      true,
	{Group: "storage.k8s.io", Kind: "VolumeAttachment"}:                               true,
	{Group: "scheduling.k8s.io", Kind: "PriorityClass"}:                               true,
	{Group: "node.k8s.io", Kind: "RuntimeClass"}:                                      true,
	{Group: "networking.k8s.io", Kind: "IngressClass"}:                                true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingWebhookConfiguration"}:   true,
	{Group: "admissionregistration.k8s.io", Kind: "MutatingWebhookConfiguration"}:     true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}:        true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicyBinding"}: true,
	{Group: "apiregistration.k8s.io", Kind: "APIService"}:                             true,
	{Group: "certificates.k8s.io", Kind: "CertificateSigningRequest"}:                 true,
	{Group: "flowcontrol.apiserver.k8s.io", Kind: "FlowSchema"}:                       true,
	{Group: "flowcontrol.apiserver.k8s.io", Kind: "PriorityLevelConfiguration"}:       true,
}

func ptr[T any](v T) *T { return &v }
