// Package v1alpha1 holds the modelorchestra.io/v1alpha1 API: the
// ModelOrchestra kind, which describes an LLM serving stack (model cache,
// inference topology, OpenAI-compatible gateway and queue) as one resource.
//
// +kubebuilder:object:generate=true
// +groupName=modelorchestra.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "modelorchestra.io", Version: "v1alpha1"}

	// SchemeBuilder registers the API types with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the API types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Kind is the kind of the ModelOrchestra resource.
const Kind = "ModelOrchestra"

// GroupVersionKind is the full type of the ModelOrchestra resource.
var GroupVersionKind = GroupVersion.WithKind(Kind)
