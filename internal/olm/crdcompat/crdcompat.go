// Package crdcompat refuses CRD changes that OLM would refuse, or that
// would break the custom resources already stored in a cluster, when a new
// operator version replaces an older one (or runs beside it: both share one
// CRD object).
//
// The rules follow OLM v0's CRD update checks (stored versions must stay,
// existing objects must validate against the new schema) and OLM v1's
// crdUpgradeSafety preflight (no scope change, no removed stored or served
// version, no new required field, no removed field, no type change, no
// default change, no new or shrunk enum, no tightened bounds or pattern).
package crdcompat

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"github.com/google/cel-go/cel"
	celast "github.com/google/cel-go/common/ast"
	celparser "github.com/google/cel-go/parser"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/model-orchestra/operator/internal/olm/check"
)

// Compare reports every incompatible change from the previous CRDs to the
// current ones. CRDs are matched by name; a new CRD is always fine.
func Compare(previous, current []*apiextv1.CustomResourceDefinition) check.Report {
	var r check.Report
	cur := map[string]*apiextv1.CustomResourceDefinition{}
	for _, c := range current {
		cur[c.Name] = c
	}
	prev := append([]*apiextv1.CustomResourceDefinition(nil), previous...)
	sort.Slice(prev, func(i, j int) bool { return prev[i].Name < prev[j].Name })
	for _, old := range prev {
		c := cur[old.Name]
		if c == nil {
			r.Errorf("crd-removed", old.Name, "the CRD was removed; custom resources of it would be deleted with it")
			continue
		}
		compareCRD(&r, old, c)
	}
	return r
}

func compareCRD(r *check.Report, old, cur *apiextv1.CustomResourceDefinition) {
	name := old.Name
	if old.Spec.Group != cur.Spec.Group || old.Spec.Names.Kind != cur.Spec.Names.Kind || old.Spec.Names.Plural != cur.Spec.Names.Plural {
		r.Errorf("crd-identity", name, "group, kind or plural changed (%s %s %s -> %s %s %s)", old.Spec.Group, old.Spec.Names.Kind, old.Spec.Names.Plural, cur.Spec.Group, cur.Spec.Names.Kind, cur.Spec.Names.Plural)
	}
	if old.Spec.Scope != cur.Spec.Scope {
		r.Errorf("crd-scope", name, "scope changed from %s to %s", old.Spec.Scope, cur.Spec.Scope)
	}
	conversion := cur.Spec.Conversion != nil && cur.Spec.Conversion.Strategy == apiextv1.WebhookConverter
	curVersions := map[string]*apiextv1.CustomResourceDefinitionVersion{}
	for i := range cur.Spec.Versions {
		curVersions[cur.Spec.Versions[i].Name] = &cur.Spec.Versions[i]
	}
	for i := range old.Spec.Versions {
		ov := &old.Spec.Versions[i]
		nv := curVersions[ov.Name]
		obj := name + " " + ov.Name
		if nv == nil {
			what := "a served version"
			if ov.Storage {
				what = "the storage version (listed in status.storedVersions of every cluster that ran it)"
			}
			r.Errorf("crd-version-removed", obj, "version %s was removed but it is %s; keep it with served: false and migrate storage first", ov.Name, what)
			continue
		}
		if ov.Served && !nv.Served && !conversion {
			r.Errorf("crd-version-unserved", obj, "version %s is no longer served; clients and stored objects of it break", ov.Name)
		}
		if ov.Schema == nil || ov.Schema.OpenAPIV3Schema == nil {
			continue
		}
		if nv.Schema == nil || nv.Schema.OpenAPIV3Schema == nil {
			r.Errorf("crd-schema", obj, "the schema was removed")
			continue
		}
		compareSchema(r, obj, "", ov.Schema.OpenAPIV3Schema, nv.Schema.OpenAPIV3Schema)
	}
}

// compareSchema walks two schemas of the same field.
func compareSchema(r *check.Report, obj, path string, old, cur *apiextv1.JSONSchemaProps) {
	field := path
	if field == "" {
		field = "."
	}
	at := func(rule, format string, args ...any) {
		r.Errorf(rule, obj, "%s: %s", field, fmt.Sprintf(format, args...))
	}
	if old.Type != cur.Type {
		at("crd-type-change", "type changed from %q to %q", old.Type, cur.Type)
	}
	if old.Format != cur.Format && cur.Format != "" {
		at("crd-format", "format changed from %q to %q", old.Format, cur.Format)
	}
	if old.Nullable && !cur.Nullable {
		at("crd-nullable", "nullable was removed; stored nulls would no longer validate")
	}
	if isTrue(old.XPreserveUnknownFields) && !isTrue(cur.XPreserveUnknownFields) {
		at("crd-preserve-unknown-fields", "x-kubernetes-preserve-unknown-fields was removed; unknown fields of stored objects would be pruned")
	}

	// Defaults: adding, changing or removing one changes stored objects.
	switch od, nd := jsonOf(old.Default), jsonOf(cur.Default); {
	case od == "" && nd != "":
		at("crd-default", "a default (%s) was added", nd)
	case od != "" && nd == "":
		at("crd-default", "the default (%s) was removed", od)
	case od != nd:
		at("crd-default", "the default changed from %s to %s", od, nd)
	}

	// Enums: a new enum, or removed values.
	if len(cur.Enum) > 0 {
		if len(old.Enum) == 0 {
			at("crd-enum", "an enum was added (%s); existing values outside it would be rejected", enumString(cur.Enum))
		} else {
			have := map[string]bool{}
			for _, v := range cur.Enum {
				have[string(v.Raw)] = true
			}
			var removed []string
			for _, v := range old.Enum {
				if !have[string(v.Raw)] {
					removed = append(removed, string(v.Raw))
				}
			}
			if len(removed) > 0 {
				at("crd-enum", "enum values were removed: %s", strings.Join(removed, ", "))
			}
		}
	}

	// Bounds.
	lower := func(name string, o, n *float64, oExcl, nExcl bool) {
		switch {
		case n == nil:
		case o == nil:
			at("crd-bounds", "%s %v was added", name, *n)
		case *n > *o || (*n == *o && nExcl && !oExcl):
			at("crd-bounds", "%s tightened from %v to %v", name, *o, *n)
		}
	}
	upper := func(name string, o, n *float64, oExcl, nExcl bool) {
		switch {
		case n == nil:
		case o == nil:
			at("crd-bounds", "%s %v was added", name, *n)
		case *n < *o || (*n == *o && nExcl && !oExcl):
			at("crd-bounds", "%s tightened from %v to %v", name, *o, *n)
		}
	}
	lower("minimum", old.Minimum, cur.Minimum, old.ExclusiveMinimum, cur.ExclusiveMinimum)
	upper("maximum", old.Maximum, cur.Maximum, old.ExclusiveMaximum, cur.ExclusiveMaximum)
	lower("minLength", f(old.MinLength), f(cur.MinLength), false, false)
	upper("maxLength", f(old.MaxLength), f(cur.MaxLength), false, false)
	lower("minItems", f(old.MinItems), f(cur.MinItems), false, false)
	upper("maxItems", f(old.MaxItems), f(cur.MaxItems), false, false)
	lower("minProperties", f(old.MinProperties), f(cur.MinProperties), false, false)
	upper("maxProperties", f(old.MaxProperties), f(cur.MaxProperties), false, false)
	if cur.MultipleOf != nil && (old.MultipleOf == nil || *old.MultipleOf != *cur.MultipleOf) {
		at("crd-bounds", "multipleOf %v was added or changed", *cur.MultipleOf)
	}
	if cur.Pattern != "" && cur.Pattern != old.Pattern {
		at("crd-pattern", "pattern %q was added or changed (was %q)", cur.Pattern, old.Pattern)
	}
	if cur.UniqueItems && !old.UniqueItems {
		at("crd-bounds", "uniqueItems was added")
	}
	if ol, nl := strOr(old.XListType, "atomic"), strOr(cur.XListType, "atomic"); old.Type == "array" && ol != nl {
		at("crd-list-type", "x-kubernetes-list-type changed from %s to %s", ol, nl)
	}
	if !reflect.DeepEqual(old.XListMapKeys, cur.XListMapKeys) && len(old.XListMapKeys)+len(cur.XListMapKeys) > 0 {
		at("crd-list-type", "x-kubernetes-list-map-keys changed from %v to %v", old.XListMapKeys, cur.XListMapKeys)
	}
	oldRules := map[string]bool{}
	for _, v := range old.XValidations {
		oldRules[v.Rule] = true
	}
	for _, v := range cur.XValidations {
		switch {
		case oldRules[v.Rule]:
		case isTransitionRule(v):
			r.Warnf("crd-transition-rule", obj, "%s: transition rule %q was added; stored objects stay valid, but every update of one evaluates it against the stored value, so it must hold when the value is unchanged", field, v.Rule)
		case holdsWithoutNewFields(v, old):
		case loosensAnOldRule(v, old.XValidations):
		default:
			at("crd-validation-rule", "validation rule %q was added", v.Rule)
		}
	}

	// Required fields: a field required now that was not, where the object
	// holding it already existed.
	wasRequired := map[string]bool{}
	for _, q := range old.Required {
		wasRequired[q] = true
	}
	for _, q := range cur.Required {
		if !wasRequired[q] {
			at("crd-new-required", "field %q became required; stored objects without it would be invalid", q)
		}
	}

	// Children.
	for _, k := range sortedProps(old.Properties) {
		oc := old.Properties[k]
		nc, ok := cur.Properties[k]
		child := path + "." + k
		if !ok {
			if cur.XPreserveUnknownFields != nil && *cur.XPreserveUnknownFields {
				continue
			}
			r.Errorf("crd-field-removed", obj, "%s: the field was removed; its stored values would be pruned", child)
			continue
		}
		compareSchema(r, obj, child, &oc, &nc)
	}
	if old.Items != nil && old.Items.Schema != nil && cur.Items != nil && cur.Items.Schema != nil {
		compareSchema(r, obj, path+"[*]", old.Items.Schema, cur.Items.Schema)
	}
	if old.AdditionalProperties != nil && old.AdditionalProperties.Schema != nil {
		if cur.AdditionalProperties != nil && cur.AdditionalProperties.Schema != nil {
			compareSchema(r, obj, path+".*", old.AdditionalProperties.Schema, cur.AdditionalProperties.Schema)
		} else if cur.AdditionalProperties == nil && len(cur.Properties) > 0 {
			r.Errorf("crd-field-removed", obj, "%s: additionalProperties was removed; stored map entries would be pruned", field)
		}
	}
}

// isTransitionRule reports whether a CEL rule is a transition rule: one
// that references oldSelf and has no optionalOldSelf. The API server
// evaluates such a rule only on an update, and only where the old object
// has a value to correlate (apiextensions-apiserver's schema/cel validator
// skips it when there is no old value); it never evaluates it on a create,
// on a read, or on a stored object alone. So adding one cannot make a
// stored object invalid, which is what the error rules here guard against.
// What it can do is refuse an update of a stored object: the API server does
// not ratchet transition rules, so a rule that is false for an unchanged
// value (rule(x, x)) would refuse every update. That is reported as a
// warning for a human to check. A rule with optionalOldSelf is also
// evaluated without an old value (on create, and where the field is new),
// like any other rule, so it is not a transition rule here; neither is a
// rule that does not parse.
func isTransitionRule(v apiextv1.ValidationRule) bool {
	if v.OptionalOldSelf != nil && *v.OptionalOldSelf {
		return false
	}
	env, err := cel.NewEnv()
	if err != nil {
		return false
	}
	parsed, iss := env.Parse(v.Rule)
	if iss.Err() != nil {
		return false
	}
	uses := false
	celast.PreOrderVisit(parsed.NativeRep().Expr(), celast.NewExprVisitor(func(e celast.Expr) {
		if e.Kind() == celast.IdentKind && e.AsIdent() == "oldSelf" {
			uses = true
		}
	}))
	return uses
}

// holdsWithoutNewFields reports whether a CEL rule holds for every object
// the old schema admits because it is guarded by a field the old schema
// does not have: the rule is a disjunction (possibly under all(), over the
// elements of a list or map) with a disjunct !has(self.<path>) whose path
// leaves the old schema. The API server prunes unknown fields, so no stored
// object has that field and the guard is true for all of them; only objects
// that use the new field are checked. Where the old schema keeps unknown
// fields, or the path goes through a map's keys, absence cannot be proven
// and the rule is treated like any other.
func holdsWithoutNewFields(v apiextv1.ValidationRule, old *apiextv1.JSONSchemaProps) bool {
	env, err := cel.NewEnv(cel.ClearMacros())
	if err != nil {
		return false
	}
	parsed, iss := env.Parse(v.Rule)
	if iss.Err() != nil {
		return false
	}
	e := parsed.NativeRep().Expr()
	// X.all(v, body) holds when body holds for every element.
	for e.Kind() == celast.CallKind && e.AsCall().FunctionName() == "all" && e.AsCall().IsMemberFunction() && len(e.AsCall().Args()) == 2 {
		e = e.AsCall().Args()[1]
	}
	for _, d := range disjuncts(e) {
		if d.Kind() != celast.CallKind || d.AsCall().FunctionName() != "!_" || len(d.AsCall().Args()) != 1 {
			continue
		}
		h := d.AsCall().Args()[0]
		if h.Kind() != celast.CallKind || h.AsCall().FunctionName() != "has" || len(h.AsCall().Args()) != 1 {
			continue
		}
		if absentFrom(h.AsCall().Args()[0], old) {
			return true
		}
	}
	return false
}

// loosensAnOldRule reports whether a CEL rule holds wherever one of the old
// rules held: its disjuncts include every disjunct of that old rule (the
// old rule with alternatives added, in any order). An object the old rule
// admitted satisfies one of the old disjuncts, and so the new rule; this is
// how a rule is widened for a new field (format: safetensors is allowed
// with model.convert) without refusing anything stored. Disjuncts are
// compared as CEL unparses them, so spacing and redundant parentheses do
// not matter.
func loosensAnOldRule(v apiextv1.ValidationRule, old []apiextv1.ValidationRule) bool {
	cur := disjunctTexts(v.Rule)
	if cur == nil {
		return false
	}
	for _, o := range old {
		prev := disjunctTexts(o.Rule)
		if prev == nil || isTransitionRule(o) != isTransitionRule(v) {
			continue
		}
		all := true
		for d := range prev {
			if !cur[d] {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// disjunctTexts is the set of a rule's top-level disjuncts as CEL unparses
// them, nil when the rule does not parse.
func disjunctTexts(rule string) map[string]bool {
	env, err := cel.NewEnv(cel.ClearMacros())
	if err != nil {
		return nil
	}
	parsed, iss := env.Parse(rule)
	if iss.Err() != nil {
		return nil
	}
	native := parsed.NativeRep()
	out := map[string]bool{}
	for _, d := range disjuncts(native.Expr()) {
		text, err := celparser.Unparse(d, native.SourceInfo())
		if err != nil {
			return nil
		}
		out[text] = true
	}
	return out
}

// disjuncts flattens a || b || c.
func disjuncts(e celast.Expr) []celast.Expr {
	if e.Kind() == celast.CallKind && e.AsCall().FunctionName() == "_||_" {
		var out []celast.Expr
		for _, a := range e.AsCall().Args() {
			out = append(out, disjuncts(a)...)
		}
		return out
	}
	return []celast.Expr{e}
}

// absentFrom reports whether the path e (self.a[i].b...) certainly names
// no field of an object valid under the schema self has.
func absentFrom(e celast.Expr, self *apiextv1.JSONSchemaProps) bool {
	node, absent := resolvePath(e, self)
	return node == nil && absent
}

// resolvePath follows e through the schema: the schema it names, or nil
// with absent true when the path leaves the schema's fields, or nil with
// absent false when it cannot tell.
func resolvePath(e celast.Expr, self *apiextv1.JSONSchemaProps) (*apiextv1.JSONSchemaProps, bool) {
	switch e.Kind() {
	case celast.IdentKind:
		if e.AsIdent() == "self" {
			return self, false
		}
	case celast.SelectKind:
		sel := e.AsSelect()
		parent, absent := resolvePath(sel.Operand(), self)
		if parent == nil {
			return nil, absent
		}
		if p, ok := parent.Properties[sel.FieldName()]; ok {
			return &p, false
		}
		if isTrue(parent.XPreserveUnknownFields) || parent.AdditionalProperties != nil {
			return nil, false
		}
		return nil, parent.Type == "object"
	case celast.CallKind:
		call := e.AsCall()
		if call.FunctionName() != "_[_]" || len(call.Args()) != 2 {
			return nil, false
		}
		parent, absent := resolvePath(call.Args()[0], self)
		switch {
		case parent == nil:
			return nil, absent
		case parent.Items != nil && parent.Items.Schema != nil:
			return parent.Items.Schema, false
		case parent.AdditionalProperties != nil && parent.AdditionalProperties.Schema != nil:
			return parent.AdditionalProperties.Schema, false
		}
	}
	return nil, false
}

func isTrue(b *bool) bool { return b != nil && *b }

func f(i *int64) *float64 {
	if i == nil {
		return nil
	}
	v := float64(*i)
	return &v
}

func strOr(s *string, def string) string {
	if s == nil || *s == "" {
		return def
	}
	return *s
}

func jsonOf(j *apiextv1.JSON) string {
	if j == nil || len(j.Raw) == 0 {
		return ""
	}
	var v any
	if err := json.Unmarshal(j.Raw, &v); err != nil {
		return string(j.Raw)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func enumString(vals []apiextv1.JSON) string {
	var s []string
	for _, v := range vals {
		s = append(s, string(v.Raw))
	}
	return strings.Join(s, ", ")
}

func sortedProps(m map[string]apiextv1.JSONSchemaProps) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Installed is one bundle's CRDs, as OLM would apply them when it installs
// the bundle.
type Installed struct {
	// Bundle names the bundle (its CSV name) in findings.
	Bundle string
	CRDs   []*apiextv1.CustomResourceDefinition
}

// CompareInstallOrders checks every ordered pair of bundles a catalog
// offers: versions installed side by side share one CRD object, and each
// install replaces it with the bundle's own. Installing any bundle after
// any other must therefore be a compatible change of every CRD both ship
// (one that only the earlier bundle ships stays as it is: OLM never deletes
// a CRD). A field the later bundle's CRD lacks is pruned from stored
// objects at their next write: crd-field-removed. In effect, every bundle
// of a catalog must ship the same schemas.
func CompareInstallOrders(bundles []Installed) check.Report {
	var r check.Report
	for _, earlier := range bundles {
		for _, later := range bundles {
			if earlier.Bundle == later.Bundle {
				continue
			}
			ships := map[string]bool{}
			for _, c := range later.CRDs {
				ships[c.Name] = true
			}
			var prev []*apiextv1.CustomResourceDefinition
			for _, c := range earlier.CRDs {
				if ships[c.Name] {
					prev = append(prev, c)
				}
			}
			rep := Compare(prev, later.CRDs)
			for _, f := range rep.Findings {
				f.Object = fmt.Sprintf("installing %s after %s: %s", later.Bundle, earlier.Bundle, f.Object)
				r.Findings = append(r.Findings, f)
			}
		}
	}
	return r
}
