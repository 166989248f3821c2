// Package validation checks a custom resource against its
// CustomResourceDefinition offline, the way the API server does on create:
// unknown fields are refused, schema defaults are applied, then the OpenAPI
// schema, list types and CEL rules (x-kubernetes-validations) are checked.
// The offline preview uses it so that a resource it accepts is one the
// cluster accepts too, with the same field-naming messages.
package validation

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// ErrInvalid is wrapped by the error Validate returns for a resource the
// API server would refuse.
var ErrInvalid = errors.New("invalid resource")

// Validator validates resources of one served version of a CRD.
type Validator struct {
	gvk        schema.GroupVersionKind
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

// New builds a Validator for the served version of the CRD given as YAML.
// When the CRD serves several versions, version picks one; empty picks the
// storage version.
func New(crdYAML []byte, version string) (*Validator, error) {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &crd); err != nil {
		return nil, fmt.Errorf("parsing CustomResourceDefinition: %w", err)
	}
	var v *apiextensionsv1.CustomResourceDefinitionVersion
	for i := range crd.Spec.Versions {
		cand := &crd.Spec.Versions[i]
		if (version == "" && cand.Storage) || cand.Name == version {
			v = cand
			break
		}
	}
	if v == nil {
		return nil, fmt.Errorf("CustomResourceDefinition %s has no version %q", crd.Name, version)
	}
	if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("CustomResourceDefinition %s version %s has no schema", crd.Name, v.Name)
	}
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, &internal, nil); err != nil {
		return nil, fmt.Errorf("converting the schema of %s: %w", crd.Name, err)
	}
	structural, err := structuralschema.NewStructural(&internal)
	if err != nil {
		return nil, fmt.Errorf("the schema of %s is not structural: %w", crd.Name, err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(&internal)
	if err != nil {
		return nil, fmt.Errorf("building the schema validator of %s: %w", crd.Name, err)
	}
	return &Validator{
		gvk:        schema.GroupVersionKind{Group: crd.Spec.Group, Version: v.Name, Kind: crd.Spec.Names.Kind},
		structural: structural,
		schema:     sv,
		cel:        cel.NewValidator(structural, true, celconfig.PerCallLimit),
	}, nil
}

// Validate checks obj as the API server would on create and, when it is
// valid, returns a copy with the schema defaults applied. The error wraps
// ErrInvalid and lists every problem with its field path.
func (v *Validator) Validate(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	out := obj.DeepCopy()
	errs := v.validate(ctx, out)
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s %q: %w", ErrInvalid, v.gvk.Kind, obj.GetName(), errs.ToAggregate())
	}
	return out, nil
}

func (v *Validator) validate(ctx context.Context, obj *unstructured.Unstructured) field.ErrorList {
	var errs field.ErrorList
	if gvk := obj.GroupVersionKind(); gvk != v.gvk {
		errs = append(errs, field.Invalid(field.NewPath("apiVersion"), obj.GetAPIVersion()+" "+obj.GetKind(),
			fmt.Sprintf("expected apiVersion %s and kind %s", v.gvk.GroupVersion(), v.gvk.Kind)))
		return errs
	}
	name := obj.GetName()
	switch name {
	case "":
		errs = append(errs, field.Required(field.NewPath("metadata", "name"), "a name is required"))
	default:
		for _, msg := range utilvalidation.IsDNS1123Subdomain(name) {
			errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), name, msg))
		}
	}

	unknown := pruning.PruneWithOptions(obj.Object, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})
	for _, p := range unknown {
		errs = append(errs, field.Forbidden(field.NewPath(p), "unknown field"))
	}
	if len(errs) > 0 {
		// Unknown fields are refused as kubectl's strict field validation
		// does; checking further would report confusing follow-up errors.
		return errs
	}

	// As the API server's decoder: defaults first, then nulls of fields
	// that may not be null and have no default are dropped.
	defaulting.Default(obj.Object, v.structural)
	defaulting.PruneNonNullableNullsWithoutDefaults(obj.Object, v.structural)

	errs = append(errs, apiservervalidation.ValidateCustomResource(nil, obj.Object, v.schema)...)
	errs = append(errs, listtype.ValidateListSetsAndMaps(nil, v.structural, obj.Object)...)
	if len(errs) > 0 {
		// The API server runs CEL rules only on schema-valid objects.
		return errs
	}
	celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj.Object, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

// Default returns a copy of obj with the schema defaults applied, as the
// API server applies them when it reads an object: absent fields with a
// default get it, nulls of fields that may not be null are dropped.
// Nothing is validated.
func (v *Validator) Default(obj *unstructured.Unstructured) *unstructured.Unstructured {
	out := obj.DeepCopy()
	defaulting.Default(out.Object, v.structural)
	defaulting.PruneNonNullableNullsWithoutDefaults(out.Object, v.structural)
	return out
}
