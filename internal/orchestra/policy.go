package orchestra

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// CheckpointPolicyGVK is the kind of checkpoint policies.
var CheckpointPolicyGVK = v1alpha1.GroupVersion.WithKind("CheckpointPolicy")

// policies are the CheckpointPolicies an orchestra's applications
// reference, as resolved for one translation or status computation.
type policies struct {
	// specs by policy name; a referenced name that is absent could not be
	// resolved.
	specs map[string]*v1alpha1.CheckpointPolicySpec
	// problems by policy name: why it could not be resolved.
	problems map[string]string
}

// referencedPolicies returns the sorted names of the CheckpointPolicies
// the applications of spec reference.
func referencedPolicies(spec *v1alpha1.ModelOrchestraSpec) []string {
	seen := map[string]bool{}
	for _, app := range spec.Applications {
		if lc := app.Lifecycle; lc != nil && lc.CheckpointPolicy != "" {
			seen[lc.CheckpointPolicy] = true
		}
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// policyReadTimeout bounds the read of one policy. From the operator's
// cache it answers at once; an operator that runs without the policy watch
// (no permission to list policies, see manager.RelatedWatch) would
// otherwise wait for a cache that never fills.
const policyReadTimeout = 5 * time.Second

// resolvePolicies reads the CheckpointPolicies mo references through r.
// A policy that does not exist or cannot be read is recorded as a problem,
// never returned as an error: the applications that reference it run with
// their inline fields, and the status says why. A nil r (the offline
// preview without policy documents) resolves nothing.
func resolvePolicies(ctx context.Context, r client.Reader, mo *v1alpha1.ModelOrchestra) policies {
	out := policies{specs: map[string]*v1alpha1.CheckpointPolicySpec{}, problems: map[string]string{}}
	for _, name := range referencedPolicies(&mo.Spec) {
		if r == nil {
			out.problems[name] = "not read: no cluster to read it from"
			continue
		}
		getCtx, cancel := context.WithTimeout(ctx, policyReadTimeout)
		spec, err := getPolicy(getCtx, r, mo.Namespace, name)
		cancel()
		switch {
		case apierrors.IsNotFound(err):
			out.problems[name] = fmt.Sprintf("CheckpointPolicy %s/%s does not exist", mo.Namespace, name)
		case meta.IsNoMatchError(err):
			out.problems[name] = "the CheckpointPolicy CRD is not installed"
		case err != nil:
			out.problems[name] = fmt.Sprintf("reading CheckpointPolicy %s/%s: %v", mo.Namespace, name, err)
		default:
			out.specs[name] = spec
		}
	}
	return out
}

// forApp is the policy spec app references, or nil.
func (p policies) forApp(app v1alpha1.Application) *v1alpha1.CheckpointPolicySpec {
	if app.Lifecycle == nil || app.Lifecycle.CheckpointPolicy == "" {
		return nil
	}
	return p.specs[app.Lifecycle.CheckpointPolicy]
}

// unresolved describes the policies that could not be resolved, sorted,
// or "" when all were.
func (p policies) unresolved() string {
	names := make([]string, 0, len(p.problems))
	for n := range p.problems {
		names = append(names, n)
	}
	sort.Strings(names)
	msgs := make([]string, 0, len(names))
	for _, n := range names {
		msgs = append(msgs, fmt.Sprintf("checkpointPolicy %q: %s", n, p.problems[n]))
	}
	return strings.Join(msgs, "; ")
}

// getPolicy reads one CheckpointPolicy. It reads it as unstructured, so
// that the operator's cache (which holds unstructured objects) serves it
// without the API types in its scheme.
func getPolicy(ctx context.Context, r client.Reader, namespace, name string) (*v1alpha1.CheckpointPolicySpec, error) {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(CheckpointPolicyGVK)
	if err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, u); err != nil {
		return nil, err
	}
	var cp v1alpha1.CheckpointPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &cp); err != nil {
		return nil, fmt.Errorf("decoding CheckpointPolicy %s/%s: %w", namespace, name, err)
	}
	return &cp.Spec, nil
}

// PolicyReferrers maps a CheckpointPolicy to the ModelOrchestras of its
// namespace that reference it, read through r (the operator's cache), so
// that a change of the policy re-renders them. It is the map function of
// the operator's CheckpointPolicy watch.
func PolicyReferrers(ctx context.Context, r client.Reader, policy client.Object) []reconcile.Request {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(v1alpha1.Kind + "List"))
	if err := r.List(ctx, list, client.InNamespace(policy.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "listing the ModelOrchestras that may reference a CheckpointPolicy; they pick up its change at their next resync",
			"checkpointPolicy", client.ObjectKeyFromObject(policy).String())
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		apps, _, _ := unstructured.NestedMap(list.Items[i].Object, "spec", "applications")
		for _, a := range apps {
			name, _, _ := unstructured.NestedString(asMap(a), "lifecycle", "checkpointPolicy")
			if name == policy.GetName() {
				out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: list.Items[i].GetNamespace(), Name: list.Items[i].GetName()}})
				break
			}
		}
	}
	return out
}

func asMap(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// PolicyDocuments is a client.Reader of CheckpointPolicies given as
// documents, for the offline preview: `orchestra template` renders a
// resource with the policies found beside it in its input, as the
// operator renders it with those of its namespace.
type PolicyDocuments map[types.NamespacedName]*unstructured.Unstructured

// Get implements client.Reader for CheckpointPolicies.
func (d PolicyDocuments) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GroupVersionKind() != CheckpointPolicyGVK {
		return fmt.Errorf("the offline preview reads CheckpointPolicies only, not %T %s", obj, obj.GetObjectKind().GroupVersionKind())
	}
	doc, ok := d[key]
	if !ok {
		return apierrors.NewNotFound(v1alpha1.GroupVersion.WithResource("checkpointpolicies").GroupResource(), key.Name)
	}
	doc.DeepCopyInto(u)
	return nil
}

// ErrOffline is what an offline reader (PolicyDocuments) answers a List
// with: there is no cluster state, such as a fetcher's report.
var ErrOffline = errors.New("the offline preview lists nothing")

// List implements client.Reader; the preview lists nothing.
func (d PolicyDocuments) List(context.Context, client.ObjectList, ...client.ListOption) error {
	return ErrOffline
}
