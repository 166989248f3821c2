// Package manifest holds the OLM annotation keys this project writes and
// reads (the ClusterServiceVersion itself is operator-framework/api's
// v1alpha1 type), the registry+v1 bundle annotations file, and the YAML
// decoding helpers of the bundle and catalog tooling.
//
// The bundle annotations are not operator-framework/api's
// manifests.AnnotationsFile, which lacks the media type and directory keys;
// operator-registry's pkg/lib/bundle.AnnotationMetadata has them, but that
// package pulls containerd and podman into every program importing it.
package manifest

// CSV annotation keys.
const (
	// AnnotationALMExamples holds a JSON array of example custom resources.
	AnnotationALMExamples = "alm-examples"
	// AnnotationSkipRange is a semver range of versions this CSV replaces.
	AnnotationSkipRange = "olm.skipRange"
	// AnnotationTargetNamespaces is set by OLM on the CSV (and so on the
	// operator pod) to the comma-separated namespaces the operator watches.
	AnnotationTargetNamespaces = "olm.targetNamespaces"
	// AnnotationCapabilities is the OperatorHub capability level.
	AnnotationCapabilities = "capabilities"
	// AnnotationCategories is the comma-separated OperatorHub categories.
	AnnotationCategories = "categories"
	// AnnotationContainerImage is the operator image shown by OperatorHub.
	AnnotationContainerImage = "containerImage"
	// AnnotationCreatedAt is when the bundle was built. We derive it from
	// nothing variable so that output stays deterministic.
	AnnotationCreatedAt = "createdAt"
	// AnnotationRepository is the source repository URL.
	AnnotationRepository = "repository"
	// AnnotationSupport names who supports the operator.
	AnnotationSupport = "support"
	// AnnotationDescription is the short description (one line).
	AnnotationDescription = "description"
)
