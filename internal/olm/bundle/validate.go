package bundle

import (
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/model-orchestra/operator/internal/olm/check"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// supportedKinds are the kinds a registry+v1 bundle may contain besides the
// CSV and CRDs (operator-registry pkg/lib/bundle/supported_resources.go).
var supportedKinds = map[string]bool{
	"ClusterServiceVersion": true, "CustomResourceDefinition": true, "Secret": true, "ConfigMap": true,
	"ServiceAccount": true, "Service": true, "Role": true, "RoleBinding": true, "ClusterRole": true,
	"ClusterRoleBinding": true, "PrometheusRule": true, "ServiceMonitor": true, "PodMonitor": true,
	"PodDisruptionBudget": true, "PriorityClass": true, "VerticalPodAutoscaler": true,
	"NetworkPolicy": true, "ConsoleYAMLSample": true, "ConsoleQuickStart": true,
	"ConsoleCLIDownload": true, "ConsoleLink": true, "ConsolePlugin": true,
}

// Validate applies the rules operator-framework's libraries do not have
// (ValidateUpstream runs theirs): the registry+v1 format rules of
// operator-registry's pkg/lib/bundle, whose module drags containerd and
// podman into any program that imports it (annotations.yaml keys and
// values, supported kinds, CRD API version), and this project's own rules:
// related images matched by RELATED_IMAGE_* variables, WATCH_NAMESPACE from
// olm.targetNamespaces, RBAC on the owned resources, descriptor paths that
// exist in the CRD schema, and what OLM v1 cannot install. Each finding
// names its rule.
func Validate(b *Bundle) check.Report {
	var r check.Report
	validateAnnotations(&r, b)
	validateKinds(&r, b)
	if b.CSV == nil {
		r.Errorf("bundle-csv", "bundle", "the bundle has no ClusterServiceVersion")
		return r
	}
	csv := b.CSV
	validateRelatedImages(&r, csv)
	validateWatchNamespace(&r, csv)
	validateOwnRBAC(&r, csv, b.CRDs)
	validateDescriptors(&r, b)
	validateOLMv1(&r, csv)
	return r
}

// validateOLMv1 warns about what OLM v1 (ClusterExtension) cannot install
// by default, so that the bundle stays installable by both generations.
func validateOLMv1(r *check.Report, csv *v1alpha1.ClusterServiceVersion) {
	if !Supports(csv, v1alpha1.InstallModeTypeAllNamespaces) {
		r.Warnf("olmv1-install-mode", csv.Name, "AllNamespaces is not supported: OLM v1 installs this bundle only with its single/own-namespace support enabled")
	}
	if len(csv.Spec.WebhookDefinitions) > 0 {
		r.Warnf("olmv1-webhooks", csv.Name, "OLM v1 installs webhooks only with its webhook support and a certificate provider enabled")
	}
	if len(csv.Spec.CustomResourceDefinitions.Required) > 0 {
		r.Warnf("olmv1-dependencies", csv.Name, "required CRDs are dependencies, which OLM v1 does not resolve")
	}
}

func validateAnnotations(r *check.Report, b *Bundle) {
	a := b.Annotations.Annotations
	for _, k := range manifest.RequiredBundleAnnotations {
		if strings.TrimSpace(a[k]) == "" {
			r.Errorf("annotations-required", "metadata/annotations.yaml", "annotation %s is missing or empty", k)
		}
	}
	if v, ok := a[manifest.AnnotationMediaType]; ok && v != manifest.MediaTypeRegistryV1 {
		r.Errorf("annotations-mediatype", "metadata/annotations.yaml", "media type is %q; OLM installs only %q", v, manifest.MediaTypeRegistryV1)
	}
	if v, ok := a[manifest.AnnotationManifests]; ok && v != manifest.ManifestsDir {
		r.Errorf("annotations-dirs", "metadata/annotations.yaml", "%s is %q; the bundle layout has %q", manifest.AnnotationManifests, v, manifest.ManifestsDir)
	}
	if v, ok := a[manifest.AnnotationMetadata]; ok && v != manifest.MetadataDir {
		r.Errorf("annotations-dirs", "metadata/annotations.yaml", "%s is %q; the bundle layout has %q", manifest.AnnotationMetadata, v, manifest.MetadataDir)
	}
	if p := a[manifest.AnnotationPackage]; p != "" {
		for _, msg := range validation.IsDNS1123Label(p) {
			r.Errorf("annotations-package", "metadata/annotations.yaml", "package name %q: %s", p, msg)
		}
	}
	channels := splitChannels(a[manifest.AnnotationChannels])
	if a[manifest.AnnotationChannels] != "" {
		for _, c := range strings.Split(a[manifest.AnnotationChannels], ",") {
			if strings.TrimSpace(c) == "" {
				r.Errorf("annotations-channels", "metadata/annotations.yaml", "channel list %q has an empty channel name", a[manifest.AnnotationChannels])
			}
		}
	}
	if d, ok := a[manifest.AnnotationDefaultChannel]; ok {
		switch {
		case strings.TrimSpace(d) == "":
			r.Errorf("annotations-default-channel", "metadata/annotations.yaml", "the default channel annotation is present but empty")
		case !contains(channels, d):
			r.Errorf("annotations-default-channel", "metadata/annotations.yaml", "default channel %q is not one of the bundle's channels %v", d, channels)
		}
	}
}

func splitChannels(s string) []string {
	var out []string
	for _, c := range strings.Split(s, ",") {
		if c = strings.TrimSpace(c); c != "" {
			out = append(out, c)
		}
	}
	return out
}

func validateKinds(r *check.Report, b *Bundle) {
	for _, o := range b.Others {
		if !supportedKinds[o.GetKind()] {
			r.Errorf("bundle-supported-kinds", o.GetKind()+"/"+o.GetName(), "kind %s is not supported in a registry+v1 bundle", o.GetKind())
		}
	}
	for _, c := range b.CRDs {
		if c.APIVersion != apiextv1.SchemeGroupVersion.String() {
			r.Errorf("crd-api-version", c.Name, "CRD apiVersion is %q; only %s is served by supported Kubernetes versions", c.APIVersion, apiextv1.SchemeGroupVersion)
		}
	}
}

// validateRelatedImages checks that every RELATED_IMAGE_* variable of the
// operator and every container image has a related image, and back. (The
// pull specs themselves are api's bundle validator's.)
func validateRelatedImages(r *check.Report, csv *v1alpha1.ClusterServiceVersion) {
	byImage := map[string]bool{}
	for _, ri := range csv.Spec.RelatedImages {
		byImage[ri.Image] = true
	}
	envImages := map[string]bool{}
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		for _, c := range d.Spec.Template.Spec.Containers {
			if !byImage[c.Image] {
				r.Errorf("related-images-env", csv.Name, "container %s/%s runs %s, which spec.relatedImages does not list", d.Name, c.Name, c.Image)
			}
			envImages[c.Image] = true
			for _, e := range c.Env {
				if !strings.HasPrefix(e.Name, RelatedImagePrefix) {
					continue
				}
				if e.Value == "" || !byImage[e.Value] {
					r.Errorf("related-images-env", csv.Name, "%s=%q of container %s has no matching entry in spec.relatedImages", e.Name, e.Value, c.Name)
				}
				envImages[e.Value] = true
			}
		}
	}
	for _, ri := range csv.Spec.RelatedImages {
		if !envImages[ri.Image] {
			r.Errorf("related-images-env", csv.Name, "related image %s (%s) is neither a container image nor a RELATED_IMAGE_* value of the operator; the operator would never use the mirrored copy", ri.Name, ri.Image)
		}
	}
}

// validateWatchNamespace checks that an operator offering namespaced install
// modes learns its target namespaces from OLM.
func validateWatchNamespace(r *check.Report, csv *v1alpha1.ClusterServiceVersion) {
	namespaced := Supports(csv, v1alpha1.InstallModeTypeOwnNamespace) || Supports(csv, v1alpha1.InstallModeTypeSingleNamespace) || Supports(csv, v1alpha1.InstallModeTypeMultiNamespace)
	if !namespaced {
		return
	}
	want := "metadata.annotations['" + manifest.AnnotationTargetNamespaces + "']"
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		if len(d.Spec.Template.Spec.Containers) == 0 {
			continue
		}
		c := d.Spec.Template.Spec.Containers[0]
		ok := false
		for _, e := range c.Env {
			if e.Name == "WATCH_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == want {
				ok = true
			}
		}
		if !ok {
			r.Errorf("watch-namespace", csv.Name, "deployment %s supports namespaced install modes but its container %s does not take WATCH_NAMESPACE from fieldRef %s", d.Name, c.Name, want)
		}
	}
}

// validateOwnRBAC checks that the operator may manage its own resources. A
// kind whose CRD has no status subresource is configuration the operator
// only reads (it reconciles nothing of it and has nothing to report on
// it): the operator needs to get, list and watch it, nothing more.
func validateOwnRBAC(r *check.Report, csv *v1alpha1.ClusterServiceVersion, crds []*apiextv1.CustomResourceDefinition) {
	sd := csv.Spec.InstallStrategy.StrategySpec
	var rules = append([]v1alpha1.StrategyDeploymentPermissions(nil), sd.Permissions...)
	rules = append(rules, sd.ClusterPermissions...)
	for _, d := range csv.Spec.CustomResourceDefinitions.Owned {
		dot := strings.Index(d.Name, ".")
		if dot < 0 {
			continue
		}
		plural, group := d.Name[:dot], d.Name[dot+1:]
		need := map[string][]string{
			plural:                 {"get", "list", "watch", "update", "patch"},
			plural + "/status":     {"get", "update", "patch"},
			plural + "/finalizers": {"update"},
		}
		if !hasStatusSubresource(crds, d.Name, d.Version) {
			need = map[string][]string{plural: {"get", "list", "watch"}}
		}
		for _, res := range sortedKeys(need) {
			for _, verb := range need[res] {
				granted := false
				for _, p := range rules {
					if Allows(p.Rules, group, res, verb) {
						granted = true
					}
				}
				if !granted {
					r.Errorf("permissions-own-crd", csv.Name, "the operator is not allowed to %s %s.%s", verb, res, group)
				}
			}
		}
	}
}

// hasStatusSubresource reports whether version of the CRD named name has a
// status subresource; true when the CRD is not in the bundle (the check
// then asks for everything).
func hasStatusSubresource(crds []*apiextv1.CustomResourceDefinition, name, version string) bool {
	for _, c := range crds {
		if c.Name != name {
			continue
		}
		for _, v := range c.Spec.Versions {
			if v.Name == version {
				return v.Subresources != nil && v.Subresources.Status != nil
			}
		}
	}
	return true
}

// validateDescriptors checks that every spec/status descriptor names a field
// of the CRD schema, so the console does not show dead fields.
func validateDescriptors(r *check.Report, b *Bundle) {
	for _, d := range b.CSV.Spec.CustomResourceDefinitions.Owned {
		var props *apiextv1.JSONSchemaProps
		for _, c := range b.CRDs {
			if c.Name != d.Name {
				continue
			}
			for _, v := range c.Spec.Versions {
				if v.Name == d.Version && v.Schema != nil {
					props = v.Schema.OpenAPIV3Schema
				}
			}
		}
		if props == nil {
			continue
		}
		check := func(root string, path string) {
			if !schemaHasPath(props, append([]string{root}, splitPath(path)...)) {
				r.Errorf("csv-descriptors", d.Name, "%s descriptor path %q is not a field of %s %s", root, path, d.Kind, d.Version)
			}
		}
		for _, desc := range d.SpecDescriptors {
			check("spec", desc.Path)
		}
		for _, desc := range d.StatusDescriptors {
			check("status", desc.Path)
		}
	}
}

// splitPath splits a descriptor path such as "gateway.replicas" or
// "models[0].name" into its field names.
func splitPath(p string) []string {
	var out []string
	for _, part := range strings.Split(p, ".") {
		if i := strings.Index(part, "["); i >= 0 {
			part = part[:i]
		}
		if part != "" {
			out = append(out, part)
		}
	}
	return out
}

func schemaHasPath(s *apiextv1.JSONSchemaProps, path []string) bool {
	for _, field := range path {
		for s.Type == "array" && s.Items != nil && s.Items.Schema != nil {
			s = s.Items.Schema
		}
		if s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields && len(s.Properties) == 0 {
			return true
		}
		if child, ok := s.Properties[field]; ok {
			s = &child
			continue
		}
		if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
			s = s.AdditionalProperties.Schema
			continue
		}
		return false
	}
	return true
}

// Supports reports whether the CSV declares mode as supported.
func Supports(csv *v1alpha1.ClusterServiceVersion, mode v1alpha1.InstallModeType) bool {
	for _, m := range csv.Spec.InstallModes {
		if m.Type == mode {
			return m.Supported
		}
	}
	return false
}
