package bundle

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/mail"
	"net/url"
	"regexp"
	"strings"

	"github.com/blang/semver/v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/model-orchestra/operator/internal/olm/check"
	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// MaxCompressedSize is the largest gzip-compressed bundle OLM accepts: the
// bundle is unpacked into a ConfigMap, whose limit is 1 MiB.
const MaxCompressedSize = 1 << 20

// warnCompressedSize is where the size check starts warning.
const warnCompressedSize = MaxCompressedSize * 8 / 10

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

// Capability levels accepted by OperatorHub.
var capabilityLevels = []string{"Basic Install", "Seamless Upgrades", "Full Lifecycle", "Deep Insights", "Auto Pilot"}

// Categories accepted by OperatorHub.
var operatorHubCategories = []string{
	"AI/Machine Learning", "Application Runtime", "Big Data", "Cloud Provider", "Database",
	"Developer Tools", "Drivers and plugins", "Integration & Delivery", "Logging & Tracing",
	"Modernization & Migration", "Monitoring", "Networking", "OpenShift Optional", "Security",
	"Storage", "Streaming & Messaging",
}

// knownCSVAnnotations are annotation keys whose case OLM checks: a key that
// equals one of them ignoring case but not exactly is a mistake OLM would
// silently ignore.
var knownCSVAnnotations = []string{
	manifest.AnnotationSkipRange, manifest.AnnotationALMExamples, "olm.properties", "olm.maxOpenShiftVersion",
	manifest.AnnotationTargetNamespaces, "olm.operatorGroup", "olm.operatorNamespace",
	manifest.AnnotationCapabilities, manifest.AnnotationCategories, manifest.AnnotationContainerImage,
	manifest.AnnotationCreatedAt, manifest.AnnotationRepository, manifest.AnnotationSupport,
	"operators.operatorframework.io/suggested-namespace", "operators.operatorframework.io/initialization-resource",
}

var channelPrefixes = []string{"candidate", "fast", "stable"}

// imageRef matches a container image reference: registry/path[:tag][@digest].
var imageRef = regexp.MustCompile(`^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-]+[a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$`)

// Validate applies the checks of operator-sdk bundle validate's default
// suite, its operatorhub and good-practices optional suites, and this
// project's own rules (related images matched by RELATED_IMAGE_* variables,
// WATCH_NAMESPACE from olm.targetNamespaces, RBAC on the owned resources).
// Each finding names its rule.
func Validate(b *Bundle) check.Report {
	var r check.Report
	validateAnnotations(&r, b)
	validateKinds(&r, b)
	validateDeprecatedAPIs(&r, b)
	validateSize(&r, b)
	if b.CSV == nil {
		r.Errorf("bundle-csv", "bundle", "the bundle has no ClusterServiceVersion")
		return r
	}
	csv := b.CSV
	validateCSVRequired(&r, csv)
	validateCSVNames(&r, b)
	validateInstallModes(&r, csv)
	validateCRDs(&r, b)
	validateExamples(&r, csv)
	validateAnnotationsCase(&r, csv)
	validateRelatedImages(&r, csv)
	validateWatchNamespace(&r, csv)
	validateOwnRBAC(&r, csv)
	validateOperatorHub(&r, csv)
	validateGoodPractices(&r, b)
	validateDescriptors(&r, b)
	validateOLMv1(&r, csv)
	return r
}

// validateOLMv1 warns about what OLM v1 (ClusterExtension) cannot install
// by default, so that the bundle stays installable by both generations.
func validateOLMv1(r *check.Report, csv *manifest.ClusterServiceVersion) {
	if !csv.Spec.Supports(manifest.InstallModeAllNamespaces) {
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

// removedAPIs are group/versions no longer served by the Kubernetes
// versions this operator supports (1.30+), as the alpha-deprecated-apis
// suite reports them.
var removedAPIs = map[string]string{
	"extensions/v1beta1":                   "1.22",
	"apps/v1beta1":                         "1.16",
	"apps/v1beta2":                         "1.16",
	"policy/v1beta1":                       "1.25",
	"batch/v1beta1":                        "1.25",
	"networking.k8s.io/v1beta1":            "1.22",
	"rbac.authorization.k8s.io/v1beta1":    "1.22",
	"apiextensions.k8s.io/v1beta1":         "1.22",
	"admissionregistration.k8s.io/v1beta1": "1.22",
	"autoscaling/v2beta1":                  "1.25",
	"autoscaling/v2beta2":                  "1.26",
	"discovery.k8s.io/v1beta1":             "1.25",
	"events.k8s.io/v1beta1":                "1.25",
	"flowcontrol.apiserver.k8s.io/v1beta1": "1.26",
	"flowcontrol.apiserver.k8s.io/v1beta2": "1.29",
	"storage.k8s.io/v1beta1":               "1.22",
	"scheduling.k8s.io/v1beta1":            "1.22",
	"coordination.k8s.io/v1beta1":          "1.22",
}

func validateDeprecatedAPIs(r *check.Report, b *Bundle) {
	for _, o := range b.Others {
		if v, ok := removedAPIs[o.GetAPIVersion()]; ok {
			r.Errorf("deprecated-apis", o.GetKind()+"/"+o.GetName(), "%s was removed in Kubernetes %s", o.GetAPIVersion(), v)
		}
	}
	if b.CSV == nil {
		return
	}
	var examples []map[string]any
	if err := json.Unmarshal([]byte(b.CSV.Annotations[manifest.AnnotationALMExamples]), &examples); err == nil {
		for i, e := range examples {
			if av, _ := e["apiVersion"].(string); removedAPIs[av] != "" {
				r.Errorf("deprecated-apis", b.CSV.Name, "example %d uses %s, removed in Kubernetes %s", i, av, removedAPIs[av])
			}
		}
	}
}

func validateSize(r *check.Report, b *Bundle) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	for _, f := range b.Files {
		_, _ = zw.Write(f.Data)
	}
	_, _ = zw.Write(AnnotationsYAML(b.Annotations))
	_ = zw.Close()
	switch n := buf.Len(); {
	case n > MaxCompressedSize:
		r.Errorf("bundle-size", "bundle", "compressed size %d bytes exceeds the %d bytes OLM can unpack", n, MaxCompressedSize)
	case n > warnCompressedSize:
		r.Warnf("bundle-size", "bundle", "compressed size %d bytes is close to the %d bytes limit", n, MaxCompressedSize)
	}
}

func validateCSVRequired(r *check.Report, csv *manifest.ClusterServiceVersion) {
	obj := csv.Name
	if csv.APIVersion != manifest.CSVAPIVersion || csv.Kind != manifest.CSVKind {
		r.Errorf("csv-apiversion", obj, "apiVersion/kind are %s/%s, want %s/%s", csv.APIVersion, csv.Kind, manifest.CSVAPIVersion, manifest.CSVKind)
	}
	req := func(ok bool, field string) {
		if !ok {
			r.Errorf("csv-required-fields", obj, "%s is required", field)
		}
	}
	s := csv.Spec
	req(s.DisplayName != "", "spec.displayName")
	req(s.InstallStrategy.StrategyName == manifest.InstallStrategyDeployment, `spec.install.strategy "deployment"`)
	req(len(s.InstallStrategy.StrategySpec.DeploymentSpecs) > 0, "spec.install.spec.deployments")
	for i, d := range s.InstallStrategy.StrategySpec.DeploymentSpecs {
		req(d.Name != "", fmt.Sprintf("spec.install.spec.deployments[%d].name", i))
		req(len(d.Spec.Template.Spec.Containers) > 0, fmt.Sprintf("spec.install.spec.deployments[%d].spec.template.spec.containers", i))
	}
	for _, p := range append(append([]manifest.StrategyDeploymentPermissions(nil), s.InstallStrategy.StrategySpec.Permissions...), s.InstallStrategy.StrategySpec.ClusterPermissions...) {
		req(p.ServiceAccountName != "", "permissions[].serviceAccountName")
		req(len(p.Rules) > 0, "permissions[].rules")
	}
	for i, d := range s.CustomResourceDefinitions.Owned {
		req(d.Name != "" && d.Version != "" && d.Kind != "", fmt.Sprintf("spec.customresourcedefinitions.owned[%d].{name,version,kind}", i))
	}
	for i, ic := range s.Icon {
		req(ic.Data != "" && ic.MediaType != "", fmt.Sprintf("spec.icon[%d].{base64data,mediatype}", i))
	}
	for i, ri := range s.RelatedImages {
		req(ri.Name != "" && ri.Image != "", fmt.Sprintf("spec.relatedImages[%d].{name,image}", i))
	}
	if s.APIServiceDefinitions != nil && len(s.APIServiceDefinitions.Owned) > 0 {
		r.Errorf("csv-apiservices", obj, "owned apiservicedefinitions are not installable by OLM v1; this operator must not need them")
	}
}

// validateCSVNames checks metadata.name, replaces, skips and the version.
func validateCSVNames(r *check.Report, b *Bundle) {
	csv := b.CSV
	nameRule := func(field, v string) {
		for _, msg := range validation.IsDNS1123Subdomain(v) {
			r.Errorf("csv-name", csv.Name, "%s %q is not a DNS-1123 subdomain: %s", field, v, msg)
		}
		for _, msg := range validation.IsValidLabelValue(v) {
			r.Errorf("csv-name", csv.Name, "%s %q is not a valid label value: %s", field, v, msg)
		}
	}
	nameRule("metadata.name", csv.Name)
	if csv.Spec.Replaces != "" {
		nameRule("spec.replaces", csv.Spec.Replaces)
		if csv.Spec.Replaces == csv.Name {
			r.Errorf("csv-replaces", csv.Name, "the CSV replaces itself")
		}
	}
	for _, s := range csv.Spec.Skips {
		if strings.TrimSpace(s) == "" {
			r.Errorf("csv-replaces", csv.Name, "spec.skips has an empty entry")
		}
	}
	if sr, ok := csv.Annotations[manifest.AnnotationSkipRange]; ok {
		if _, err := semver.ParseRange(sr); err != nil {
			r.Errorf("csv-skip-range", csv.Name, "olm.skipRange %q is not a semver range: %v", sr, err)
		}
	}
	if csv.Spec.MinKubeVersion == "" {
		r.Warnf("csv-min-kube-version", csv.Name, "spec.minKubeVersion is not set; OLM will install on any cluster version")
	} else if _, err := semver.Parse(strings.TrimPrefix(csv.Spec.MinKubeVersion, "v")); err != nil {
		r.Errorf("csv-min-kube-version", csv.Name, "spec.minKubeVersion %q is not semver: %v", csv.Spec.MinKubeVersion, err)
	}
	if csv.Spec.Version == "" {
		r.Errorf("operatorhub-version", csv.Name, "spec.version is required")
		return
	}
	v, err := semver.Parse(csv.Spec.Version)
	if err != nil {
		r.Errorf("operatorhub-version", csv.Name, "spec.version %q is not semver: %v", csv.Spec.Version, err)
		return
	}
	if pkg := b.Package(); pkg != "" && csv.Name != CSVName(pkg, v.String()) {
		r.Warnf("good-practices-csv-name", csv.Name, "the CSV name should be %q (<package>.v<version>)", CSVName(pkg, v.String()))
	}
}

func validateInstallModes(r *check.Report, csv *manifest.ClusterServiceVersion) {
	modes := csv.Spec.InstallModes
	if len(modes) == 0 {
		r.Errorf("csv-installmodes", csv.Name, "spec.installModes is empty; OLM cannot match any OperatorGroup")
		return
	}
	seen := map[manifest.InstallModeType]bool{}
	supported := 0
	for _, m := range modes {
		if !contains(installModeNames(), string(m.Type)) {
			r.Errorf("csv-installmodes", csv.Name, "unknown install mode %q", m.Type)
		}
		if seen[m.Type] {
			r.Errorf("csv-installmodes", csv.Name, "install mode %s is listed twice", m.Type)
		}
		seen[m.Type] = true
		if m.Supported {
			supported++
		}
	}
	if supported == 0 {
		r.Errorf("csv-installmodes", csv.Name, "no install mode is supported")
	}
	// Conversion webhooks can only be served cluster-wide.
	for _, w := range csv.Spec.WebhookDefinitions {
		if len(w.ConversionCRDs) == 0 {
			continue
		}
		for _, m := range modes {
			if m.Supported && m.Type != manifest.InstallModeAllNamespaces {
				r.Errorf("csv-conversion-webhook", csv.Name, "webhook %s converts CRDs, so only AllNamespaces may be supported, not %s", w.GenerateName, m.Type)
			}
		}
		if !csv.Spec.Supports(manifest.InstallModeAllNamespaces) {
			r.Errorf("csv-conversion-webhook", csv.Name, "webhook %s converts CRDs, which requires AllNamespaces", w.GenerateName)
		}
		for _, c := range w.ConversionCRDs {
			if !ownsCRD(csv, c) {
				r.Errorf("csv-conversion-webhook", csv.Name, "webhook %s converts %s, which the CSV does not own", w.GenerateName, c)
			}
		}
	}
}

func installModeNames() []string {
	var out []string
	for _, m := range manifest.AllInstallModes {
		out = append(out, string(m))
	}
	return out
}

func ownsCRD(csv *manifest.ClusterServiceVersion, name string) bool {
	for _, d := range csv.Spec.CustomResourceDefinitions.Owned {
		if d.Name == name {
			return true
		}
	}
	return false
}

func validateCRDs(r *check.Report, b *Bundle) {
	csv := b.CSV
	byName := map[string]*apiextv1.CustomResourceDefinition{}
	for _, c := range b.CRDs {
		if byName[c.Name] != nil {
			r.Errorf("bundle-owned-crds", c.Name, "the CRD appears twice in the bundle")
		}
		byName[c.Name] = c
		if !ownsCRD(csv, c.Name) {
			r.Errorf("bundle-owned-crds", c.Name, "the bundle contains this CRD but the CSV does not list it in spec.customresourcedefinitions.owned")
		}
		validateCRDSchema(r, c)
	}
	for _, d := range csv.Spec.CustomResourceDefinitions.Owned {
		c := byName[d.Name]
		if c == nil {
			r.Errorf("bundle-owned-crds", d.Name, "the CSV owns this CRD but the bundle does not contain it")
			continue
		}
		if want := c.Spec.Names.Plural + "." + c.Spec.Group; d.Name != want {
			r.Errorf("bundle-owned-crds", d.Name, "owned CRD name must be <plural>.<group> = %q", want)
		}
		if d.Kind != c.Spec.Names.Kind {
			r.Errorf("bundle-owned-crds", d.Name, "owned CRD kind %q does not match the CRD's kind %q", d.Kind, c.Spec.Names.Kind)
		}
		found := false
		for _, v := range c.Spec.Versions {
			if v.Name == d.Version {
				found = true
			}
		}
		if !found {
			r.Errorf("bundle-owned-crds", d.Name, "owned version %q is not a version of the CRD", d.Version)
		}
		if strings.TrimSpace(d.Description) == "" {
			r.Warnf("good-practices-crd-description", d.Name, "owned CRD %s has no description", d.Version)
		}
	}
	// No service account manifest may shadow the deployment's: OLM creates it.
	sas := map[string]bool{}
	for _, p := range append(append([]manifest.StrategyDeploymentPermissions(nil), csv.Spec.InstallStrategy.StrategySpec.Permissions...), csv.Spec.InstallStrategy.StrategySpec.ClusterPermissions...) {
		sas[p.ServiceAccountName] = true
	}
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		sas[d.Spec.Template.Spec.ServiceAccountName] = true
	}
	for _, o := range b.Others {
		if o.GetKind() == "ServiceAccount" && sas[o.GetName()] {
			r.Errorf("bundle-service-account", o.GetName(), "the bundle contains a ServiceAccount that the CSV's deployment uses; OLM creates it, remove the manifest")
		}
	}
}

// validateCRDSchema runs the API server's own CRD validation.
func validateCRDSchema(r *check.Report, c *apiextv1.CustomResourceDefinition) {
	v1 := c.DeepCopy()
	apiextv1.SetObjectDefaults_CustomResourceDefinition(v1)
	var internal apiextensions.CustomResourceDefinition
	if err := apiextv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(v1, &internal, nil); err != nil {
		r.Errorf("crd-validation", c.Name, "converting the CRD: %v", err)
		return
	}
	for _, v := range internal.Spec.Versions {
		if v.Storage {
			internal.Status.StoredVersions = []string{v.Name}
		}
	}
	for _, e := range crdvalidation.ValidateCustomResourceDefinition(context.Background(), &internal) {
		r.Errorf("crd-validation", c.Name, "%v", e)
	}
}

func validateExamples(r *check.Report, csv *manifest.ClusterServiceVersion) {
	raw, ok := csv.Annotations[manifest.AnnotationALMExamples]
	if !ok || strings.TrimSpace(raw) == "" {
		r.Warnf("csv-alm-examples", csv.Name, "no alm-examples annotation: the console offers no example to start from")
		return
	}
	var examples []map[string]any
	if err := json.Unmarshal([]byte(raw), &examples); err != nil {
		r.Errorf("csv-alm-examples", csv.Name, "alm-examples is not a JSON array of objects: %v", err)
		return
	}
	covered := map[schema.GroupVersionKind]bool{}
	for i, e := range examples {
		apiVersion, _ := e["apiVersion"].(string)
		kind, _ := e["kind"].(string)
		if apiVersion == "" || kind == "" {
			r.Errorf("csv-alm-examples", csv.Name, "example %d has no apiVersion or kind", i)
			continue
		}
		gv, err := schema.ParseGroupVersion(apiVersion)
		if err != nil {
			r.Errorf("csv-alm-examples", csv.Name, "example %d: %v", i, err)
			continue
		}
		covered[gv.WithKind(kind)] = true
		if !ownsGVK(csv, gv.WithKind(kind)) {
			r.Errorf("csv-alm-examples", csv.Name, "example %d is a %s %s, which the CSV does not own", i, apiVersion, kind)
		}
	}
	for _, d := range csv.Spec.CustomResourceDefinitions.Owned {
		group := d.Name[strings.Index(d.Name, ".")+1:]
		if !covered[schema.GroupVersionKind{Group: group, Version: d.Version, Kind: d.Kind}] {
			r.Warnf("csv-alm-examples", csv.Name, "no example for owned %s %s/%s", d.Kind, group, d.Version)
		}
	}
}

func ownsGVK(csv *manifest.ClusterServiceVersion, gvk schema.GroupVersionKind) bool {
	for _, d := range csv.Spec.CustomResourceDefinitions.Owned {
		if d.Kind == gvk.Kind && d.Version == gvk.Version && strings.HasSuffix(d.Name, "."+gvk.Group) {
			return true
		}
	}
	return false
}

func validateAnnotationsCase(r *check.Report, csv *manifest.ClusterServiceVersion) {
	for k := range csv.Annotations {
		for _, known := range knownCSVAnnotations {
			if strings.EqualFold(k, known) && k != known {
				r.Errorf("csv-annotation-case", csv.Name, "annotation %q must be spelled %q; OLM ignores it otherwise", k, known)
			}
		}
	}
}

// validateRelatedImages checks the pull specs and that every
// RELATED_IMAGE_* variable of the operator has a related image, and back.
func validateRelatedImages(r *check.Report, csv *manifest.ClusterServiceVersion) {
	if len(csv.Spec.RelatedImages) == 0 {
		r.Errorf("csv-related-images", csv.Name, "spec.relatedImages is empty; disconnected installs cannot mirror the operator's images")
	}
	byImage := map[string]bool{}
	names := map[string]bool{}
	for _, ri := range csv.Spec.RelatedImages {
		if !imageRef.MatchString(ri.Image) {
			r.Errorf("csv-related-images", csv.Name, "related image %q is not a valid pull spec: %q", ri.Name, ri.Image)
		}
		if names[ri.Name] {
			r.Errorf("csv-related-images", csv.Name, "related image name %q is used twice", ri.Name)
		}
		names[ri.Name] = true
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
func validateWatchNamespace(r *check.Report, csv *manifest.ClusterServiceVersion) {
	namespaced := csv.Spec.Supports(manifest.InstallModeOwnNamespace) || csv.Spec.Supports(manifest.InstallModeSingleNamespace) || csv.Spec.Supports(manifest.InstallModeMultiNamespace)
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

// validateOwnRBAC checks that the operator may manage its own resources.
func validateOwnRBAC(r *check.Report, csv *manifest.ClusterServiceVersion) {
	sd := csv.Spec.InstallStrategy.StrategySpec
	var rules = append([]manifest.StrategyDeploymentPermissions(nil), sd.Permissions...)
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

func validateOperatorHub(r *check.Report, csv *manifest.ClusterServiceVersion) {
	s := csv.Spec
	if len(s.Icon) != 1 {
		r.Errorf("operatorhub-icon", csv.Name, "exactly one icon is expected, found %d", len(s.Icon))
	}
	for _, ic := range s.Icon {
		if !contains([]string{"image/gif", "image/jpeg", "image/png", "image/svg+xml"}, ic.MediaType) {
			r.Errorf("operatorhub-icon", csv.Name, "icon media type %q is not one of image/gif, image/jpeg, image/png, image/svg+xml", ic.MediaType)
		}
		data, err := base64.StdEncoding.DecodeString(ic.Data)
		if err != nil || len(data) == 0 {
			r.Errorf("operatorhub-icon", csv.Name, "icon data is not base64: %v", err)
		} else if ic.MediaType == "image/svg+xml" && !bytes.Contains(data, []byte("<svg")) {
			r.Errorf("operatorhub-icon", csv.Name, "icon declared as SVG does not contain an <svg> element")
		}
	}
	for i, l := range s.Links {
		if l.Name == "" {
			r.Errorf("operatorhub-links", csv.Name, "links[%d] has no name", i)
		}
		if u, err := url.Parse(l.URL); err != nil || u.Scheme == "" || u.Host == "" {
			r.Errorf("operatorhub-links", csv.Name, "links[%d] URL %q is not an absolute URL", i, l.URL)
		}
	}
	if len(s.Links) == 0 {
		r.Warnf("operatorhub-links", csv.Name, "no links (documentation, source)")
	}
	if len(s.Maintainers) == 0 {
		r.Errorf("operatorhub-maintainers", csv.Name, "at least one maintainer is required")
	}
	for i, m := range s.Maintainers {
		if m.Name == "" {
			r.Errorf("operatorhub-maintainers", csv.Name, "maintainers[%d] has no name", i)
		}
		if _, err := mail.ParseAddress(m.Email); err != nil {
			r.Errorf("operatorhub-maintainers", csv.Name, "maintainers[%d] email %q is invalid: %v", i, m.Email, err)
		}
	}
	if s.Provider == nil || s.Provider.Name == "" {
		r.Errorf("operatorhub-provider", csv.Name, "spec.provider.name is required")
	}
	if strings.TrimSpace(s.Description) == "" {
		r.Errorf("operatorhub-description", csv.Name, "spec.description is required")
	}
	if len(s.Keywords) == 0 {
		r.Warnf("operatorhub-keywords", csv.Name, "no keywords: the operator is hard to find in OperatorHub")
	}
	if s.Maturity == "" {
		r.Warnf("operatorhub-maturity", csv.Name, "spec.maturity is not set")
	}
	capability, ok := csv.Annotations[manifest.AnnotationCapabilities]
	if !ok {
		r.Errorf("operatorhub-capabilities", csv.Name, "the capabilities annotation is required")
	} else if !contains(capabilityLevels, capability) {
		r.Errorf("operatorhub-capabilities", csv.Name, "capabilities %q is not one of %v", capability, capabilityLevels)
	}
	if cats, ok := csv.Annotations[manifest.AnnotationCategories]; ok {
		for _, c := range strings.Split(cats, ",") {
			if c = strings.TrimSpace(c); !contains(operatorHubCategories, c) {
				r.Errorf("operatorhub-categories", csv.Name, "category %q is not one OperatorHub knows %v", c, operatorHubCategories)
			}
		}
	} else {
		r.Warnf("operatorhub-categories", csv.Name, "no categories annotation")
	}
}

func validateGoodPractices(r *check.Report, b *Bundle) {
	csv := b.CSV
	for _, d := range csv.Spec.InstallStrategy.StrategySpec.DeploymentSpecs {
		for _, c := range append(append([]corev1.Container(nil), d.Spec.Template.Spec.InitContainers...), d.Spec.Template.Spec.Containers...) {
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
				r.Warnf("good-practices-resources", csv.Name, "container %s/%s has no cpu and memory requests", d.Name, c.Name)
			}
		}
	}
	for _, c := range splitChannels(b.Annotations.Annotations[manifest.AnnotationChannels]) {
		ok := false
		for _, p := range channelPrefixes {
			if strings.HasPrefix(c, p) {
				ok = true
			}
		}
		if !ok {
			r.Warnf("good-practices-channels", c, "channel names should start with candidate, fast or stable")
		}
	}
	sd := csv.Spec.InstallStrategy.StrategySpec
	for _, p := range append(append([]manifest.StrategyDeploymentPermissions(nil), sd.Permissions...), sd.ClusterPermissions...) {
		for _, verb := range []string{"create", "update", "patch", "delete"} {
			if Allows(p.Rules, "apiextensions.k8s.io", "customresourcedefinitions", verb) {
				r.Warnf("good-practices-crd-rbac", csv.Name, "service account %s may %s CustomResourceDefinitions; OLM manages CRDs, the operator should not", p.ServiceAccountName, verb)
			}
		}
	}
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
		check := func(root string, descs []manifest.Descriptor) {
			for _, desc := range descs {
				if !schemaHasPath(props, append([]string{root}, splitPath(desc.Path)...)) {
					r.Errorf("csv-descriptors", d.Name, "%s descriptor path %q is not a field of %s %s", root, desc.Path, d.Kind, d.Version)
				}
			}
		}
		check("spec", d.SpecDescriptors)
		check("status", d.StatusDescriptors)
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
