// Package manifest declares the OLM manifest types this project writes and
// reads: the ClusterServiceVersion (operators.coreos.com/v1alpha1), the
// registry+v1 bundle annotations, and the bundle and catalog image labels.
//
// The types follow the field names and JSON tags of the upstream OLM API
// (operator-framework/api pkg/operators/v1alpha1), which this module cannot
// import. Fields that upstream declares without omitempty are required and
// keep no omitempty here either, so a missing value is visible in output.
package manifest

import (
	"encoding/json"

	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CSV constants.
const (
	CSVAPIVersion = "operators.coreos.com/v1alpha1"
	CSVKind       = "ClusterServiceVersion"

	// InstallStrategyDeployment is the only install strategy OLM supports.
	InstallStrategyDeployment = "deployment"

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

// InstallModeType is one of the four OLM install modes.
type InstallModeType string

// The install modes, see docs/olm.md for how they map onto OperatorGroups.
const (
	InstallModeOwnNamespace    InstallModeType = "OwnNamespace"
	InstallModeSingleNamespace InstallModeType = "SingleNamespace"
	InstallModeMultiNamespace  InstallModeType = "MultiNamespace"
	InstallModeAllNamespaces   InstallModeType = "AllNamespaces"
)

// AllInstallModes lists the install modes in their conventional order.
var AllInstallModes = []InstallModeType{InstallModeOwnNamespace, InstallModeSingleNamespace, InstallModeMultiNamespace, InstallModeAllNamespaces}

// ClusterServiceVersion describes one version of an operator.
type ClusterServiceVersion struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              CSVSpec `json:"spec"`
}

// CSVSpec is the spec of a ClusterServiceVersion.
type CSVSpec struct {
	InstallStrategy           NamedInstallStrategy      `json:"install"`
	Version                   string                    `json:"version,omitempty"`
	Maturity                  string                    `json:"maturity,omitempty"`
	CustomResourceDefinitions CustomResourceDefinitions `json:"customresourcedefinitions,omitempty"`
	APIServiceDefinitions     *APIServiceDefinitions    `json:"apiservicedefinitions,omitempty"`
	WebhookDefinitions        []WebhookDescription      `json:"webhookdefinitions,omitempty"`
	NativeAPIs                []metav1.GroupVersionKind `json:"nativeAPIs,omitempty"`
	MinKubeVersion            string                    `json:"minKubeVersion,omitempty"`
	DisplayName               string                    `json:"displayName"`
	Description               string                    `json:"description,omitempty"`
	Keywords                  []string                  `json:"keywords,omitempty"`
	Maintainers               []Maintainer              `json:"maintainers,omitempty"`
	Provider                  *AppLink                  `json:"provider,omitempty"`
	Links                     []AppLink                 `json:"links,omitempty"`
	Icon                      []Icon                    `json:"icon,omitempty"`
	InstallModes              []InstallMode             `json:"installModes,omitempty"`
	Replaces                  string                    `json:"replaces,omitempty"`
	Labels                    map[string]string         `json:"labels,omitempty"`
	Annotations               map[string]string         `json:"annotations,omitempty"`
	Selector                  *metav1.LabelSelector     `json:"selector,omitempty"`
	Cleanup                   *CleanupSpec              `json:"cleanup,omitempty"`
	Skips                     []string                  `json:"skips,omitempty"`
	RelatedImages             []RelatedImage            `json:"relatedImages,omitempty"`
}

// NamedInstallStrategy is spec.install.
type NamedInstallStrategy struct {
	StrategyName string                    `json:"strategy"`
	StrategySpec StrategyDetailsDeployment `json:"spec,omitempty"`
}

// StrategyDetailsDeployment is spec.install.spec for the deployment strategy.
type StrategyDetailsDeployment struct {
	DeploymentSpecs    []StrategyDeploymentSpec        `json:"deployments"`
	Permissions        []StrategyDeploymentPermissions `json:"permissions,omitempty"`
	ClusterPermissions []StrategyDeploymentPermissions `json:"clusterPermissions,omitempty"`
}

// StrategyDeploymentSpec is one Deployment OLM creates.
type StrategyDeploymentSpec struct {
	Name  string                `json:"name"`
	Spec  appsv1.DeploymentSpec `json:"spec"`
	Label map[string]string     `json:"label,omitempty"`
}

// StrategyDeploymentPermissions binds rules to a service account.
type StrategyDeploymentPermissions struct {
	ServiceAccountName string              `json:"serviceAccountName"`
	Rules              []rbacv1.PolicyRule `json:"rules"`
}

// CustomResourceDefinitions lists the CRDs an operator owns and requires.
type CustomResourceDefinitions struct {
	Owned    []CRDDescription `json:"owned,omitempty"`
	Required []CRDDescription `json:"required,omitempty"`
}

// CRDDescription describes one CRD version for the UI and the resolver.
type CRDDescription struct {
	Name              string                 `json:"name"`
	Version           string                 `json:"version"`
	Kind              string                 `json:"kind"`
	DisplayName       string                 `json:"displayName,omitempty"`
	Description       string                 `json:"description,omitempty"`
	Resources         []APIResourceReference `json:"resources,omitempty"`
	StatusDescriptors []Descriptor           `json:"statusDescriptors,omitempty"`
	SpecDescriptors   []Descriptor           `json:"specDescriptors,omitempty"`
	ActionDescriptor  []Descriptor           `json:"actionDescriptors,omitempty"`
}

// APIResourceReference names a kind the operator creates for a CR.
type APIResourceReference struct {
	Name    string `json:"name"`
	Kind    string `json:"kind"`
	Version string `json:"version"`
}

// Descriptor describes one field of a CR for the console (spec, status and
// action descriptors share this shape).
type Descriptor struct {
	Path         string          `json:"path"`
	DisplayName  string          `json:"displayName,omitempty"`
	Description  string          `json:"description,omitempty"`
	XDescriptors []string        `json:"x-descriptors,omitempty"`
	Value        json.RawMessage `json:"value,omitempty"`
}

// APIServiceDefinitions lists aggregated API services. This project has
// none; the type exists so the validator can refuse them (OLM v1 does).
type APIServiceDefinitions struct {
	Owned    []APIServiceDescription `json:"owned,omitempty"`
	Required []APIServiceDescription `json:"required,omitempty"`
}

// APIServiceDescription describes one aggregated API.
type APIServiceDescription struct {
	Name    string `json:"name"`
	Group   string `json:"group"`
	Version string `json:"version"`
	Kind    string `json:"kind"`
}

// WebhookDescription is a webhook OLM installs for the operator.
type WebhookDescription struct {
	GenerateName            string   `json:"generateName"`
	Type                    string   `json:"type"`
	DeploymentName          string   `json:"deploymentName,omitempty"`
	ContainerPort           int32    `json:"containerPort,omitempty"`
	TargetPort              *int32   `json:"targetPort,omitempty"`
	AdmissionReviewVersions []string `json:"admissionReviewVersions"`
	SideEffects             *string  `json:"sideEffects"`
	WebhookPath             *string  `json:"webhookPath,omitempty"`
	ConversionCRDs          []string `json:"conversionCRDs,omitempty"`
}

// Maintainer is a person or team to contact.
type Maintainer struct {
	Name  string `json:"name,omitempty"`
	Email string `json:"email,omitempty"`
}

// AppLink is a named URL.
type AppLink struct {
	Name string `json:"name,omitempty"`
	URL  string `json:"url,omitempty"`
}

// Icon is a base64-encoded image.
type Icon struct {
	Data      string `json:"base64data"`
	MediaType string `json:"mediatype"`
}

// InstallMode says whether one install mode is supported.
type InstallMode struct {
	Type      InstallModeType `json:"type"`
	Supported bool            `json:"supported"`
}

// CleanupSpec says whether OLM deletes leftover resources.
type CleanupSpec struct {
	Enabled bool `json:"enabled"`
}

// RelatedImage is an image the operator may run, for disconnected mirroring.
type RelatedImage struct {
	Name  string `json:"name"`
	Image string `json:"image"`
}

// Supports reports whether the CSV declares mode as supported.
func (s CSVSpec) Supports(mode InstallModeType) bool {
	for _, m := range s.InstallModes {
		if m.Type == mode {
			return m.Supported
		}
	}
	return false
}
