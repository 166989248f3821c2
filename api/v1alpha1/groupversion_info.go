// Package v1alpha1 holds the modelorchestra.io/v1alpha1 API: the
// ModelOrchestra kind, which describes an LLM serving stack (model cache,
// inference topology, OpenAI-compatible gateway and queue) as one resource,
// CheckpointPolicy, how idle engines sleep and where their weights rest, and
// ModelCheckpoint, where the weights of one application rest.
//
// +kubebuilder:object:generate=true
// +groupName=modelorchestra.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of this API.
	GroupVersion = schema.GroupVersion{Group: "modelorchestra.io", Version: "v1alpha1"}

	// SchemeBuilder registers the API types with a runtime.Scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the API types to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers the kinds of this group version, as
// controller-runtime's deprecated scheme.Builder used to.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ModelOrchestra{}, &ModelOrchestraList{},
		&CheckpointPolicy{}, &CheckpointPolicyList{}, &ModelCheckpoint{}, &ModelCheckpointList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Kind is the kind of the ModelOrchestra resource.
const Kind = "ModelOrchestra"

// GroupVersionKind is the full type of the ModelOrchestra resource.
var GroupVersionKind = GroupVersion.WithKind(Kind)
