package crdcompat

import (
	"testing"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/model-orchestra/operator/internal/olm/check"
)

func ptr[T any](v T) *T { return &v }

func js(raw string) apiextv1.JSON { return apiextv1.JSON{Raw: []byte(raw)} }

// baseCRD is the previous release's CRD: one served storage version with a
// spec of a few constrained fields.
func baseCRD() *apiextv1.CustomResourceDefinition {
	spec := apiextv1.JSONSchemaProps{
		Type:     "object",
		Required: []string{"size"},
		Properties: map[string]apiextv1.JSONSchemaProps{
			"size":   {Type: "integer", Minimum: ptr(1.0), Maximum: ptr(10.0)},
			"color":  {Type: "string", Enum: []apiextv1.JSON{js(`"red"`), js(`"blue"`)}},
			"name":   {Type: "string", MaxLength: ptr(int64(63))},
			"tags":   {Type: "array", Items: &apiextv1.JSONSchemaPropsOrArray{Schema: &apiextv1.JSONSchemaProps{Type: "string"}}},
			"labels": {Type: "object", AdditionalProperties: &apiextv1.JSONSchemaPropsOrBool{Allows: true, Schema: &apiextv1.JSONSchemaProps{Type: "string"}}},
			"mode":   {Type: "string", Default: ptr(js(`"fast"`))},
			"extra":  {Type: "object", XPreserveUnknownFields: ptr(true)},
			"note":   {Type: "string", Nullable: true},
		},
	}
	return &apiextv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.io"},
		Spec: apiextv1.CustomResourceDefinitionSpec{
			Group: "example.io",
			Names: apiextv1.CustomResourceDefinitionNames{Kind: "Widget", Plural: "widgets"},
			Scope: apiextv1.NamespaceScoped,
			Versions: []apiextv1.CustomResourceDefinitionVersion{{
				Name: "v1alpha1", Served: true, Storage: true,
				Schema: &apiextv1.CustomResourceValidation{OpenAPIV3Schema: &apiextv1.JSONSchemaProps{
					Type:       "object",
					Properties: map[string]apiextv1.JSONSchemaProps{"spec": spec},
				}},
			}},
		},
	}
}

func specOf(c *apiextv1.CustomResourceDefinition) *apiextv1.JSONSchemaProps {
	s := c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"]
	return &s
}

// editSpec changes the spec schema of version 0 through fn.
func editSpec(c *apiextv1.CustomResourceDefinition, fn func(s *apiextv1.JSONSchemaProps)) {
	s := specOf(c)
	fn(s)
	c.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"] = *s
}

func editField(c *apiextv1.CustomResourceDefinition, field string, fn func(p *apiextv1.JSONSchemaProps)) {
	editSpec(c, func(s *apiextv1.JSONSchemaProps) {
		p := s.Properties[field]
		fn(&p)
		s.Properties[field] = p
	})
}

func TestRefusedChanges(t *testing.T) {
	tests := []struct {
		name, rule string
		mutate     func(c *apiextv1.CustomResourceDefinition) []*apiextv1.CustomResourceDefinition
	}{
		{"CRD removed", "crd-removed", func(c *apiextv1.CustomResourceDefinition) []*apiextv1.CustomResourceDefinition { return nil }},
		{"scope change", "crd-scope", one(func(c *apiextv1.CustomResourceDefinition) { c.Spec.Scope = apiextv1.ClusterScoped })},
		{"kind renamed", "crd-identity", one(func(c *apiextv1.CustomResourceDefinition) { c.Spec.Names.Kind = "Gadget" })},
		{"stored version removed", "crd-version-removed", one(func(c *apiextv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Name = "v1"
		})},
		{"served version unserved", "crd-version-unserved", one(func(c *apiextv1.CustomResourceDefinition) {
			c.Spec.Versions[0].Served = false
			v1 := *c.Spec.Versions[0].DeepCopy()
			v1.Name, v1.Served, v1.Storage = "v1", true, false
			c.Spec.Versions = append(c.Spec.Versions, v1)
		})},
		{"schema removed", "crd-schema", one(func(c *apiextv1.CustomResourceDefinition) { c.Spec.Versions[0].Schema = nil })},
		{"new required field", "crd-new-required", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) { s.Required = append(s.Required, "color") })
		})},
		{"field removed", "crd-field-removed", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) { delete(s.Properties, "name") })
		})},
		{"map values removed", "crd-field-removed", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "labels", func(p *apiextv1.JSONSchemaProps) {
				p.AdditionalProperties = nil
				p.Properties = map[string]apiextv1.JSONSchemaProps{"app": {Type: "string"}}
			})
		})},
		{"type change", "crd-type-change", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "size", func(p *apiextv1.JSONSchemaProps) { p.Type = "string"; p.Minimum, p.Maximum = nil, nil })
		})},
		{"type change in array items", "crd-type-change", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "tags", func(p *apiextv1.JSONSchemaProps) { p.Items.Schema.Type = "integer" })
		})},
		{"new enum", "crd-enum", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.Enum = []apiextv1.JSON{js(`"a"`)} })
		})},
		{"enum value removed", "crd-enum", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "color", func(p *apiextv1.JSONSchemaProps) { p.Enum = p.Enum[:1] })
		})},
		{"minimum raised", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "size", func(p *apiextv1.JSONSchemaProps) { p.Minimum = ptr(2.0) })
		})},
		{"minimum made exclusive", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "size", func(p *apiextv1.JSONSchemaProps) { p.ExclusiveMinimum = true })
		})},
		{"maximum lowered", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "size", func(p *apiextv1.JSONSchemaProps) { p.Maximum = ptr(5.0) })
		})},
		{"maxLength lowered", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.MaxLength = ptr(int64(20)) })
		})},
		{"minLength added", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.MinLength = ptr(int64(1)) })
		})},
		{"maxItems added", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "tags", func(p *apiextv1.JSONSchemaProps) { p.MaxItems = ptr(int64(3)) })
		})},
		{"uniqueItems added", "crd-bounds", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "tags", func(p *apiextv1.JSONSchemaProps) { p.UniqueItems = true })
		})},
		{"pattern added", "crd-pattern", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.Pattern = "^[a-z]+$" })
		})},
		{"format added", "crd-format", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.Format = "hostname" })
		})},
		{"default changed", "crd-default", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "mode", func(p *apiextv1.JSONSchemaProps) { p.Default = ptr(js(`"slow"`)) })
		})},
		{"default added", "crd-default", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.Default = ptr(js(`"x"`)) })
		})},
		{"default removed", "crd-default", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "mode", func(p *apiextv1.JSONSchemaProps) { p.Default = nil })
		})},
		{"nullable removed", "crd-nullable", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "note", func(p *apiextv1.JSONSchemaProps) { p.Nullable = false })
		})},
		{"preserve-unknown-fields removed", "crd-preserve-unknown-fields", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "extra", func(p *apiextv1.JSONSchemaProps) { p.XPreserveUnknownFields = nil })
		})},
		{"list type changed", "crd-list-type", one(func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "tags", func(p *apiextv1.JSONSchemaProps) { p.XListType = ptr("set") })
		})},
		{"CEL rule added", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "self.size < 5"}}
			})
		})},
		{"CEL rule with optionalOldSelf added", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				// Evaluated on create too (oldSelf is then none).
				s.XValidations = apiextv1.ValidationRules{{Rule: "!oldSelf.hasValue() || self.size == oldSelf.value().size", OptionalOldSelf: ptr(true)}}
			})
		})},
		{"CEL rule guarded by a field the old schema has", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "!has(self.name) || size(self.name) > 3"}}
			})
		})},
		{"CEL rule guarded by a field where unknown fields are kept", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "!has(self.extra.knob) || self.size > 2"}}
			})
		})},
		{"CEL rule guarded by a map key", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "!has(self.labels.team) || self.size > 2"}}
			})
		})},
		{"CEL rule guarded by a new field in a conjunction", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "!has(self.gateway) && self.size > 2"}}
			})
		})},
		{"CEL rule with the new-field guard under exists", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "self.tags.exists(t, !has(self.gateway) || t == 'x')"}}
			})
		})},
		{"CEL rule naming oldSelf only in a string", "crd-validation-rule", one(func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.XValidations = apiextv1.ValidationRules{{Rule: "self.name != 'oldSelf'"}}
			})
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cur := tc.mutate(baseCRD())
			rep := Compare([]*apiextv1.CustomResourceDefinition{baseCRD()}, cur)
			found := false
			for _, r := range rep.Rules("error") {
				if r == tc.rule {
					found = true
				}
			}
			if !found {
				t.Fatalf("rule %s not reported; findings: %v", tc.rule, rep.Findings)
			}
		})
	}
}

func one(fn func(c *apiextv1.CustomResourceDefinition)) func(c *apiextv1.CustomResourceDefinition) []*apiextv1.CustomResourceDefinition {
	return func(c *apiextv1.CustomResourceDefinition) []*apiextv1.CustomResourceDefinition {
		fn(c)
		return []*apiextv1.CustomResourceDefinition{c}
	}
}

// TestTransitionRuleAddedIsAWarning: a rule referencing oldSelf runs only
// on updates, against the old value, so stored objects stay valid; it is
// reported as a warning (it must hold for an unchanged value), not an error.
func TestTransitionRuleAddedIsAWarning(t *testing.T) {
	cur := baseCRD()
	editField(cur, "size", func(p *apiextv1.JSONSchemaProps) {
		p.XValidations = apiextv1.ValidationRules{{Rule: "self == oldSelf", Message: "size cannot be changed"}}
	})
	rep := Compare([]*apiextv1.CustomResourceDefinition{baseCRD()}, []*apiextv1.CustomResourceDefinition{cur})
	if rep.HasErrors() {
		t.Fatalf("an added transition rule was refused: %v", rep.Errors())
	}
	if got := rep.Rules(check.Warning); len(got) != 1 || got[0] != "crd-transition-rule" {
		t.Fatalf("warnings = %v, want one crd-transition-rule; findings %v", got, rep.Findings)
	}
	// Unchanged, it is not reported again.
	if again := Compare([]*apiextv1.CustomResourceDefinition{cur}, []*apiextv1.CustomResourceDefinition{cur}); len(again.Findings) != 0 {
		t.Errorf("an unchanged transition rule was reported: %v", again.Findings)
	}
}

func TestAllowedChanges(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(c *apiextv1.CustomResourceDefinition)
	}{
		{"unchanged", func(c *apiextv1.CustomResourceDefinition) {}},
		{"optional field added", func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.Properties["replicas"] = apiextv1.JSONSchemaProps{Type: "integer", Minimum: ptr(0.0)}
			})
		}},
		{"new object with its own required field", func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.Properties["gateway"] = apiextv1.JSONSchemaProps{Type: "object", Required: []string{"port"}, Properties: map[string]apiextv1.JSONSchemaProps{"port": {Type: "integer"}}}
			})
		}},
		{"enum value added", func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "color", func(p *apiextv1.JSONSchemaProps) { p.Enum = append(p.Enum, js(`"green"`)) })
		}},
		{"bounds loosened", func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "size", func(p *apiextv1.JSONSchemaProps) { p.Minimum, p.Maximum = ptr(0.0), nil })
			editField(c, "name", func(p *apiextv1.JSONSchemaProps) { p.MaxLength = ptr(int64(253)) })
		}},
		{"required dropped", func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) { s.Required = nil })
		}},
		{"description changed", func(c *apiextv1.CustomResourceDefinition) {
			editField(c, "size", func(p *apiextv1.JSONSchemaProps) { p.Description = "how big" })
		}},
		// Stored objects cannot have a field the old schema lacks (the API
		// server prunes it), so a rule that holds whenever it is absent
		// cannot invalidate them.
		{"CEL rule guarded by a new field", func(c *apiextv1.CustomResourceDefinition) {
			editSpec(c, func(s *apiextv1.JSONSchemaProps) {
				s.Properties["gateway"] = apiextv1.JSONSchemaProps{Type: "object", Properties: map[string]apiextv1.JSONSchemaProps{"port": {Type: "integer"}}}
				s.XValidations = apiextv1.ValidationRules{
					{Rule: "!has(self.gateway) || !has(self.gateway.port) || self.gateway.port > self.size"},
					{Rule: "self.tags.all(t, self.size > 1 || !has(self.gateway.port))"},
				}
			})
		}},
		{"new version added, storage moved", func(c *apiextv1.CustomResourceDefinition) {
			v1 := *c.Spec.Versions[0].DeepCopy()
			v1.Name = "v1"
			c.Spec.Versions[0].Storage = false
			c.Spec.Versions = append(c.Spec.Versions, v1)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cur := baseCRD()
			tc.mutate(cur)
			extra := baseCRD()
			extra.Name = "gadgets.example.io"
			rep := Compare([]*apiextv1.CustomResourceDefinition{baseCRD()}, []*apiextv1.CustomResourceDefinition{cur, extra})
			if len(rep.Findings) != 0 {
				t.Fatalf("a compatible change was refused: %v", rep.Findings)
			}
		})
	}
}

// TestWidenedRuleIsAllowed: a rule replaced by the same rule with more
// alternatives admits everything the old one did, so it is no finding; a
// rule changed any other way is refused as an added rule.
func TestWidenedRuleIsAllowed(t *testing.T) {
	const oldRule = "self.size > 0 || self.name == 'x'"
	withRule := func(rule string) *apiextv1.CustomResourceDefinition {
		c := baseCRD()
		editSpec(c, func(s *apiextv1.JSONSchemaProps) {
			s.XValidations = apiextv1.ValidationRules{{Rule: rule, Message: "m"}}
		})
		return c
	}
	tests := []struct {
		name    string
		rule    string
		refused bool
	}{
		{"alternative added", "self.size > 0 || self.name == 'x' || self.color == 'red'", false},
		{"alternatives reordered and reparenthesised", "(self.color == 'red') || (self.name == 'x') || self.size > 0", false},
		{"an alternative narrowed", "self.size > 1 || self.name == 'x' || self.color == 'red'", true},
		{"an alternative dropped", "self.size > 0", true},
		{"a conjunct added", "(self.size > 0 || self.name == 'x') && self.color == 'red'", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Compare([]*apiextv1.CustomResourceDefinition{withRule(oldRule)}, []*apiextv1.CustomResourceDefinition{withRule(tt.rule)})
			if rep.HasErrors() != tt.refused {
				t.Errorf("%q after %q: errors %v, want refused %v", tt.rule, oldRule, rep.Errors(), tt.refused)
			}
		})
	}
}
