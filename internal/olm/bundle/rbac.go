package bundle

import (
	"fmt"
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// HelmVerbs are the verbs the Helm engine uses on every object a chart
// renders: install creates, upgrade gets and patches (or updates with
// force), uninstall deletes, and dependent watches list and watch.
var HelmVerbs = []string{"create", "delete", "get", "list", "patch", "update", "watch"}

// clusterScopedKinds are the built-in kinds that are not namespaced. A chart
// that renders one needs clusterPermissions.
var clusterScopedKinds = map[schema.GroupKind]bool{
	{Group: "", Kind: "Namespace"}:                                                    true,
	{Group: "", Kind: "Node"}:                                                         true,
	{Group: "", Kind: "PersistentVolume"}:                                             true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRole"}:                         true,
	{Group: "rbac.authorization.k8s.io", Kind: "ClusterRoleBinding"}:                  true,
	{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}:                 true,
	{Group: "scheduling.k8s.io", Kind: "PriorityClass"}:                               true,
	{Group: "storage.k8s.io", Kind: "StorageClass"}:                                   true,
	{Group: "networking.k8s.io", Kind: "IngressClass"}:                                true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingWebhookConfiguration"}:   true,
	{Group: "admissionregistration.k8s.io", Kind: "MutatingWebhookConfiguration"}:     true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicy"}:        true,
	{Group: "apiregistration.k8s.io", Kind: "APIService"}:                             true,
	{Group: "node.k8s.io", Kind: "RuntimeClass"}:                                      true,
	{Group: "flowcontrol.apiserver.k8s.io", Kind: "FlowSchema"}:                       true,
	{Group: "flowcontrol.apiserver.k8s.io", Kind: "PriorityLevelConfiguration"}:       true,
	{Group: "admissionregistration.k8s.io", Kind: "ValidatingAdmissionPolicyBinding"}: true,
}

// irregularResources are kinds whose plural the usual English rule gets
// wrong.
var irregularResources = map[schema.GroupKind]string{
	{Group: "", Kind: "Endpoints"}:                          "endpoints",
	{Group: "policy", Kind: "PodDisruptionBudget"}:          "poddisruptionbudgets",
	{Group: "autoscaling", Kind: "HorizontalPodAutoscaler"}: "horizontalpodautoscalers",
}

// resourceFor maps a kind to its resource name and scope without a cluster.
func resourceFor(gk schema.GroupKind) (resource string, namespaced bool) {
	if r, ok := irregularResources[gk]; ok {
		return r, !clusterScopedKinds[gk]
	}
	plural, _ := meta.UnsafeGuessKindToResource(gk.WithVersion("v1"))
	return plural.Resource, !clusterScopedKinds[gk]
}

// DerivedRules are the RBAC rules the operator needs to manage what the
// charts render.
type DerivedRules struct {
	// Namespaced go into the CSV's permissions (OLM grants them in every
	// target namespace).
	Namespaced []rbacv1.PolicyRule
	// Cluster go into clusterPermissions.
	Cluster []rbacv1.PolicyRule
	// Kinds lists the rendered kinds, sorted, for reports.
	Kinds []string
}

// DeriveRules collects the kinds of the rendered objects and returns the
// least rules that let the Helm engine manage them. When the chart renders
// Roles or ClusterRoles, the operator must itself hold what they grant
// (Kubernetes refuses privilege escalation), so their rules are added too.
func DeriveRules(objs []*unstructured.Unstructured) (DerivedRules, error) {
	namespaced := map[string]map[string]bool{} // group -> resources
	cluster := map[string]map[string]bool{}
	var granted, grantedCluster []rbacv1.PolicyRule
	kinds := map[string]bool{}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		if gvk.Kind == "" {
			return DerivedRules{}, fmt.Errorf("rendered object %q has no kind", o.GetName())
		}
		kinds[gvk.GroupKind().String()] = true
		res, isNamespaced := resourceFor(gvk.GroupKind())
		target := namespaced
		if !isNamespaced {
			target = cluster
		}
		if target[gvk.Group] == nil {
			target[gvk.Group] = map[string]bool{}
		}
		target[gvk.Group][res] = true
		if gvk.Group == rbacv1.GroupName && (gvk.Kind == "Role" || gvk.Kind == "ClusterRole") {
			var role rbacv1.ClusterRole // Role and ClusterRole share .rules
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
				return DerivedRules{}, fmt.Errorf("decoding rendered %s %s: %w", gvk.Kind, o.GetName(), err)
			}
			// The chart names objects after each custom resource, so a
			// rule limited to the sample's resourceNames would not cover
			// the next resource: hold the rule on the whole resource.
			for i := range role.Rules {
				role.Rules[i].ResourceNames = nil
			}
			if gvk.Kind == "Role" {
				granted = append(granted, role.Rules...)
			} else {
				grantedCluster = append(grantedCluster, role.Rules...)
			}
		}
	}
	out := DerivedRules{
		Namespaced: MergeRules(append(rulesFor(namespaced), granted...)),
		Cluster:    MergeRules(append(rulesFor(cluster), grantedCluster...)),
	}
	out.Kinds = sortedKeys(kinds)
	return out, nil
}

func rulesFor(byGroup map[string]map[string]bool) []rbacv1.PolicyRule {
	var rules []rbacv1.PolicyRule
	for _, g := range sortedKeys(byGroup) {
		rules = append(rules, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: sortedKeys(byGroup[g]), Verbs: append([]string(nil), HelmVerbs...)})
	}
	return rules
}

// MergeRules normalises rules into a canonical, minimal form: every
// (API group, resource) gets the union of the verbs granted on it, resources
// with the same group and verbs share one rule, and rules are sorted. Rules
// with resourceNames or nonResourceURLs are kept unless a plain rule already
// grants all they do. Equal permissions therefore always print the same way.
func MergeRules(rules []rbacv1.PolicyRule) []rbacv1.PolicyRule {
	type gr struct{ group, resource string }
	verbs := map[gr]map[string]bool{}
	var special []rbacv1.PolicyRule
	for _, r := range rules {
		if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			special = append(special, normaliseRule(r))
			continue
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				k := gr{g, res}
				if verbs[k] == nil {
					verbs[k] = map[string]bool{}
				}
				for _, v := range r.Verbs {
					verbs[k][v] = true
				}
			}
		}
	}
	type gv struct{ group, verbs string }
	grouped := map[gv]map[string]bool{}
	for k, vs := range verbs {
		key := gv{k.group, strings.Join(sortedKeys(vs), ",")}
		if grouped[key] == nil {
			grouped[key] = map[string]bool{}
		}
		grouped[key][k.resource] = true
	}
	var out []rbacv1.PolicyRule
	for k, res := range grouped {
		out = append(out, rbacv1.PolicyRule{APIGroups: []string{k.group}, Resources: sortedKeys(res), Verbs: strings.Split(k.verbs, ",")})
	}
	plain := append([]rbacv1.PolicyRule(nil), out...)
	for _, r := range special {
		if len(r.NonResourceURLs) == 0 && coveredBy(plain, r) {
			continue
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool { return ruleKey(out[i]) < ruleKey(out[j]) })
	var dedup []rbacv1.PolicyRule
	for i, r := range out {
		if i > 0 && ruleKey(r) == ruleKey(out[i-1]) {
			continue
		}
		dedup = append(dedup, r)
	}
	return dedup
}

// coveredBy reports whether plain rules grant everything r grants.
func coveredBy(plain []rbacv1.PolicyRule, r rbacv1.PolicyRule) bool {
	for _, g := range r.APIGroups {
		for _, res := range r.Resources {
			for _, v := range r.Verbs {
				if !Allows(plain, g, res, v) {
					return false
				}
			}
		}
	}
	return true
}

func normaliseRule(r rbacv1.PolicyRule) rbacv1.PolicyRule {
	c := *r.DeepCopy()
	for _, s := range [][]string{c.APIGroups, c.Resources, c.Verbs, c.ResourceNames, c.NonResourceURLs} {
		sort.Strings(s)
	}
	return c
}

func ruleKey(r rbacv1.PolicyRule) string {
	return strings.Join([]string{strings.Join(r.APIGroups, ","), strings.Join(r.Resources, ","), strings.Join(r.ResourceNames, ","), strings.Join(r.NonResourceURLs, ","), strings.Join(r.Verbs, ",")}, "\x00")
}

// Allows reports whether rules grant verb on group/resource (wildcards
// honoured). The validator uses it to check that the operator may manage
// its own custom resources.
func Allows(rules []rbacv1.PolicyRule, group, resource, verb string) bool {
	for _, r := range rules {
		if len(r.NonResourceURLs) > 0 || len(r.ResourceNames) > 0 {
			continue
		}
		if matches(r.APIGroups, group) && matches(r.Resources, resource) && matches(r.Verbs, verb) {
			return true
		}
	}
	return false
}

func matches(list []string, want string) bool {
	for _, s := range list {
		if s == want || s == rbacv1.ResourceAll {
			return true
		}
	}
	return false
}
