package bundle

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	apiversion "github.com/operator-framework/api/pkg/lib/version"
	"github.com/operator-framework/api/pkg/operators/v1alpha1"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/blang/semver/v4"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// Renderer renders one custom resource through the product chart, the way
// the operator would, and returns the objects it would apply. env holds the
// literal environment variables of the operator container (the
// RELATED_IMAGE_* variables among them), which the operator's watches.yaml
// turns into chart values.
type Renderer interface {
	Render(ctx context.Context, cr *unstructured.Unstructured, env map[string]string) ([]*unstructured.Unstructured, error)
}

// RenderFunc adapts a function to Renderer.
type RenderFunc func(ctx context.Context, cr *unstructured.Unstructured, env map[string]string) ([]*unstructured.Unstructured, error)

// Render calls f.
func (f RenderFunc) Render(ctx context.Context, cr *unstructured.Unstructured, env map[string]string) ([]*unstructured.Unstructured, error) {
	return f(ctx, cr, env)
}

// Config says where the bundle's sources are and what to call the release.
// Paths are relative to Root.
type Config struct {
	// Root is the repository root.
	Root string
	// Version is the operator version (semver, without a leading v).
	Version string
	// PackageName is the OLM package, also the CSV name prefix.
	PackageName string
	// ImageRepository is where the project's images live; images under it
	// are tagged v<Version>.
	ImageRepository string
	// OperatorImageName is the operator image's name under ImageRepository.
	OperatorImageName string
	// Channels and DefaultChannel go into annotations.yaml. Empty means
	// candidate-vX, fast-vX, stable-vX with default stable-vX, matching the
	// major channels the semver catalog template generates.
	Channels       []string
	DefaultChannel string
	// Replaces is the CSV name this one replaces. Empty means the highest of
	// PreviousVersions below Version.
	Replaces string
	// Skips are CSV names this one skips.
	Skips []string
	// SkipRange is the olm.skipRange annotation. Empty means
	// ">=<lowest previous version> <Version>" when there are previous
	// versions; "none" means no annotation.
	SkipRange string
	// PreviousVersions are the versions already released.
	PreviousVersions []semver.Version
	// ImageDefaults maps every RELATED_IMAGE_* variable the operator reads
	// to its default image (internal/orchestra.Images). The Deployment must
	// list each of them; one written without a value takes its default.
	ImageDefaults map[string]string

	CSVBase    string // config/manifests/bases/<pkg>.clusterserviceversion.yaml
	Icon       string // config/manifests/icon.svg
	CRDDir     string // config/crd/bases
	SamplesDir string // config/samples
	// InternalExamplesDir holds examples of the kinds the operator manages
	// (listed in the CSV base's operators.operatorframework.io/internal-objects
	// annotation). They go into alm-examples, which the validators want for
	// every owned kind, but are not rendered and are not samples for users.
	// Optional.
	InternalExamplesDir string // config/samples/internal
	ManagerFile         string // config/manager/manager.yaml
	OperatorRules       string // config/rbac/operator_role.yaml
	ChartTemplates      string // charts/model-orchestra (optional: its and its subcharts' templates are scanned for kinds)
	ExtraManifests      string // config/manifests/extra (optional dir of Services etc.)
}

// Default returns the configuration of this repository.
func Default() Config {
	return Config{
		Root:                ".",
		PackageName:         "orchestra-operator",
		ImageRepository:     "ghcr.io/model-orchestra",
		OperatorImageName:   "orchestra-operator",
		CSVBase:             "config/manifests/bases/orchestra-operator.clusterserviceversion.yaml",
		Icon:                "config/manifests/icon.svg",
		CRDDir:              "config/crd/bases",
		SamplesDir:          "config/samples",
		InternalExamplesDir: "config/samples/internal",
		ManagerFile:         "config/manager/manager.yaml",
		OperatorRules:       "config/rbac/operator_role.yaml",
		ChartTemplates:      "charts/model-orchestra",
		ExtraManifests:      "config/manifests/extra",
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if _, err := semver.Parse(c.Version); err != nil {
		errs = append(errs, fmt.Errorf("version %q is not semver (use 1.2.3, without v): %w", c.Version, err))
	}
	if c.PackageName == "" || c.ImageRepository == "" || c.OperatorImageName == "" {
		errs = append(errs, errors.New("package name, image repository and operator image name are required"))
	}
	if c.DefaultChannel != "" && !contains(c.Channels, c.DefaultChannel) && len(c.Channels) > 0 {
		errs = append(errs, fmt.Errorf("default channel %q is not one of the channels %v", c.DefaultChannel, c.Channels))
	}
	return errors.Join(errs...)
}

// CSVName returns <package>.v<version>.
func CSVName(pkg, version string) string { return pkg + ".v" + version }

// OperatorImage returns the operator image of this release.
func (c Config) OperatorImage() string {
	return c.ImageRepository + "/" + c.OperatorImageName + ":v" + c.Version
}

// BundleImage returns the bundle image of version v.
func (c Config) BundleImage(v string) string {
	return c.ImageRepository + "/" + c.OperatorImageName + "-bundle:v" + v
}

// Result is a generated bundle and what was learnt on the way.
type Result struct {
	Bundle *Bundle
	// Rules are the operator's namespaced rules (its own plus derived), as
	// also written to config/rbac and the install chart.
	Rules []rbacv1.PolicyRule
	// ClusterRules are the cluster-scoped rules (usually none).
	ClusterRules []rbacv1.PolicyRule
	// RenderedKinds are the kinds the chart rendered for the samples.
	RenderedKinds []string
	// Notes are non-fatal observations (for example a rendered image that
	// is not among the related images).
	Notes []string
}

// Generate builds the bundle from the repository sources. The output is a
// function of the sources and cfg only: no clock, no environment.
func Generate(ctx context.Context, cfg Config, r Renderer) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	version := semver.MustParse(cfg.Version)
	path := func(p string) string {
		if filepath.IsAbs(p) {
			return p
		}
		return filepath.Join(cfg.Root, p)
	}

	csv, err := loadBase(path(cfg.CSVBase))
	if err != nil {
		return nil, err
	}
	crdFiles, crds, err := loadCRDs(path(cfg.CRDDir))
	if err != nil {
		return nil, err
	}
	samples, err := loadSamples(path(cfg.SamplesDir), crds)
	if err != nil {
		return nil, err
	}
	internalExamples, err := loadInternalExamples(cfg.InternalExamplesDir, path(cfg.InternalExamplesDir), csv, crds)
	if err != nil {
		return nil, err
	}
	dep, err := loadDeployment(path(cfg.ManagerFile))
	if err != nil {
		return nil, err
	}
	ownRules, err := loadRules(path(cfg.OperatorRules))
	if err != nil {
		return nil, err
	}
	res := &Result{}

	// Images: the operator container and every RELATED_IMAGE_* variable.
	related, err := setImages(&dep.Spec.Template.Spec, cfg)
	if err != nil {
		return nil, err
	}

	// Permissions: the operator's own plus what the chart renders.
	env := map[string]string{}
	for _, e := range dep.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom == nil {
			env[e.Name] = e.Value
		}
	}
	var rendered []*unstructured.Unstructured
	createdFor := map[string]map[v1alpha1.APIResourceReference]bool{} // owned kind -> kinds it creates
	for _, s := range samples {
		objs, err := r.Render(ctx, s, env)
		if err != nil {
			return nil, fmt.Errorf("rendering sample %s/%s through the chart: %w", s.GetKind(), s.GetName(), err)
		}
		rendered = append(rendered, objs...)
		if createdFor[s.GetKind()] == nil {
			createdFor[s.GetKind()] = map[v1alpha1.APIResourceReference]bool{}
		}
		for _, o := range objs {
			createdFor[s.GetKind()][v1alpha1.APIResourceReference{Kind: o.GetKind(), Version: o.GroupVersionKind().Version}] = true
		}
	}
	if cfg.ChartTemplates != "" {
		kinds, unresolved, err := ScanChartKinds(path(cfg.ChartTemplates))
		if err != nil {
			return nil, fmt.Errorf("scanning chart templates: %w", err)
		}
		renderedKinds := map[string]bool{}
		for _, o := range rendered {
			renderedKinds[o.GroupVersionKind().GroupKind().String()] = true
		}
		for _, k := range kinds {
			if !renderedKinds[k.GroupKind().String()] {
				res.Notes = append(res.Notes, fmt.Sprintf("the chart can render %s, which no sample renders; the operator is granted it from the template scan", k.GroupKind()))
			}
		}
		for _, u := range unresolved {
			res.Notes = append(res.Notes, fmt.Sprintf("cannot tell the kind of %s; make sure a sample renders it", u))
		}
		rendered = append(rendered, kindObjects(kinds)...)
	}
	derived, err := DeriveRules(rendered)
	if err != nil {
		return nil, err
	}
	res.RenderedKinds = derived.Kinds
	res.Rules = MergeRules(append(append([]rbacv1.PolicyRule(nil), ownRules...), derived.Namespaced...))
	res.ClusterRules = derived.Cluster
	res.Notes = append(res.Notes, unrelatedImages(rendered, related)...)

	sa := dep.Spec.Template.Spec.ServiceAccountName
	if sa == "" {
		return nil, fmt.Errorf("%s: the operator Deployment must set spec.template.spec.serviceAccountName", cfg.ManagerFile)
	}

	// Metadata.
	csv.APIVersion, csv.Kind = v1alpha1.SchemeGroupVersion.String(), v1alpha1.ClusterServiceVersionKind
	csv.Name = CSVName(cfg.PackageName, cfg.Version)
	csv.Namespace = ""
	if csv.Annotations == nil {
		csv.Annotations = map[string]string{}
	}
	examples, err := json.MarshalIndent(samplesForExamples(append(append([]*unstructured.Unstructured(nil), samples...), internalExamples...)), "", "  ")
	if err != nil {
		return nil, err
	}
	csv.Annotations[manifest.AnnotationALMExamples] = string(examples)
	csv.Annotations[manifest.AnnotationContainerImage] = cfg.OperatorImage()
	prev := previousBelow(cfg.PreviousVersions, version)
	switch {
	case cfg.SkipRange == "none":
		delete(csv.Annotations, manifest.AnnotationSkipRange)
	case cfg.SkipRange != "":
		csv.Annotations[manifest.AnnotationSkipRange] = cfg.SkipRange
	case len(prev) > 0:
		csv.Annotations[manifest.AnnotationSkipRange] = fmt.Sprintf(">=%s <%s", prev[0], version)
	}

	// Spec.
	csv.Spec.Version = apiversion.OperatorVersion{Version: version}
	csv.Spec.Replaces = cfg.Replaces
	if csv.Spec.Replaces == "" && len(prev) > 0 {
		csv.Spec.Replaces = CSVName(cfg.PackageName, prev[len(prev)-1].String())
	}
	csv.Spec.Skips = cfg.Skips
	if cfg.Icon != "" {
		data, err := os.ReadFile(path(cfg.Icon))
		if err != nil {
			return nil, fmt.Errorf("reading icon: %w", err)
		}
		csv.Spec.Icon = []v1alpha1.Icon{{Data: base64.StdEncoding.EncodeToString(data), MediaType: iconMediaType(cfg.Icon)}}
	}
	owned, err := ownedCRDs(csv.Spec.CustomResourceDefinitions.Owned, crds)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.CSVBase, err)
	}
	// The console lists the kinds each resource creates: those the chart
	// rendered for its samples, unless the base lists them by hand.
	for i := range owned {
		if len(owned[i].Resources) > 0 {
			continue
		}
		for ref := range createdFor[owned[i].Kind] {
			owned[i].Resources = append(owned[i].Resources, ref)
		}
		sort.Slice(owned[i].Resources, func(a, b int) bool {
			ra, rb := owned[i].Resources[a], owned[i].Resources[b]
			if ra.Kind != rb.Kind {
				return ra.Kind < rb.Kind
			}
			return ra.Version < rb.Version
		})
	}
	csv.Spec.CustomResourceDefinitions.Owned = owned
	csv.Spec.InstallStrategy = v1alpha1.NamedInstallStrategy{
		StrategyName: v1alpha1.InstallStrategyNameDeployment,
		StrategySpec: v1alpha1.StrategyDetailsDeployment{
			DeploymentSpecs: []v1alpha1.StrategyDeploymentSpec{{Name: dep.Name, Spec: dep.Spec, Label: dep.Labels}},
			Permissions:     []v1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: sa, Rules: res.Rules}},
		},
	}
	if len(res.ClusterRules) > 0 {
		csv.Spec.InstallStrategy.StrategySpec.ClusterPermissions = []v1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: sa, Rules: res.ClusterRules}}
	}
	csv.Spec.RelatedImages = related

	csvData, err := MarshalCSV(csv)
	if err != nil {
		return nil, err
	}
	b := &Bundle{}
	b.Files = append(b.Files, File{Name: cfg.PackageName + ".clusterserviceversion.yaml", Data: csvData})
	b.Files = append(b.Files, crdFiles...)
	extra, err := loadExtra(path(cfg.ExtraManifests))
	if err != nil {
		return nil, err
	}
	b.Files = append(b.Files, extra...)
	sort.Slice(b.Files, func(i, j int) bool { return b.Files[i].Name < b.Files[j].Name })

	channels, def := cfg.Channels, cfg.DefaultChannel
	if len(channels) == 0 {
		for _, a := range []string{"candidate", "fast", "stable"} {
			channels = append(channels, fmt.Sprintf("%s-v%d", a, version.Major))
		}
		if def == "" {
			def = fmt.Sprintf("stable-v%d", version.Major)
		}
	}
	b.Annotations = manifest.BundleAnnotations{Annotations: map[string]string{
		manifest.AnnotationMediaType: manifest.MediaTypeRegistryV1,
		manifest.AnnotationManifests: manifest.ManifestsDir,
		manifest.AnnotationMetadata:  manifest.MetadataDir,
		manifest.AnnotationPackage:   cfg.PackageName,
		manifest.AnnotationChannels:  strings.Join(channels, ","),
	}}
	if def != "" {
		b.Annotations.Annotations[manifest.AnnotationDefaultChannel] = def
	}
	if err := b.decodeFiles(); err != nil {
		return nil, fmt.Errorf("re-reading the generated bundle: %w", err)
	}
	res.Bundle = b
	return res, nil
}

func loadBase(path string) (*v1alpha1.ClusterServiceVersion, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading CSV base: %w", err)
	}
	csv := &v1alpha1.ClusterServiceVersion{}
	if err := yaml.UnmarshalStrict(data, csv); err != nil {
		return nil, fmt.Errorf("parsing CSV base %s: %w", path, err)
	}
	return csv, nil
}

func loadCRDs(dir string) ([]File, []*apiextv1.CustomResourceDefinition, error) {
	paths, err := manifest.YAMLFiles(dir, false)
	if err != nil {
		return nil, nil, fmt.Errorf("listing CRDs: %w", err)
	}
	var files []File
	var crds []*apiextv1.CustomResourceDefinition
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, nil, err
		}
		docs, err := manifest.Documents(data)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, doc := range docs {
			crd := &apiextv1.CustomResourceDefinition{}
			if err := yaml.Unmarshal(doc, crd); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", p, err)
			}
			if crd.Kind != "CustomResourceDefinition" || crd.APIVersion != apiextv1.SchemeGroupVersion.String() {
				return nil, nil, fmt.Errorf("%s: expected apiextensions.k8s.io/v1 CustomResourceDefinition, got %s %s", p, crd.APIVersion, crd.Kind)
			}
			crds = append(crds, crd)
		}
		files = append(files, File{Name: filepath.Base(p), Data: data})
	}
	if len(crds) == 0 {
		return nil, nil, fmt.Errorf("no CRD in %s", dir)
	}
	return files, crds, nil
}

// loadSamples returns the sample custom resources of the owned CRDs, sorted
// by kind, API version and name. Other documents (kustomization files)
// are ignored; a sample of an unknown kind is an error.
func loadSamples(dir string, crds []*apiextv1.CustomResourceDefinition) ([]*unstructured.Unstructured, error) {
	paths, err := manifest.YAMLFiles(dir, false)
	if err != nil {
		return nil, fmt.Errorf("listing samples: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, p := range paths {
		if strings.HasPrefix(filepath.Base(p), "kustomization.") {
			continue
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		objs, err := manifest.Objects(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, o := range objs {
			if o.GetKind() == "Kustomization" {
				continue
			}
			if !servedBy(crds, o) {
				return nil, fmt.Errorf("%s: sample %s %s is not a served version of an owned CRD", p, o.GetAPIVersion(), o.GetKind())
			}
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no sample custom resource in %s: alm-examples needs at least one", dir)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.GetKind() != b.GetKind() {
			return a.GetKind() < b.GetKind()
		}
		if a.GetAPIVersion() != b.GetAPIVersion() {
			return a.GetAPIVersion() < b.GetAPIVersion()
		}
		return a.GetName() < b.GetName()
	})
	return out, nil
}

// AnnotationInternalObjects lists, as a JSON array of CRD names, the owned
// kinds the operator manages itself; consoles hide them from users.
const AnnotationInternalObjects = "operators.operatorframework.io/internal-objects"

// loadInternalExamples returns the examples of the kinds the CSV base lists
// as internal objects. Each must be of an owned CRD listed there, so that an
// example of a kind users create is not hidden among them.
func loadInternalExamples(rel, dir string, csv *v1alpha1.ClusterServiceVersion, crds []*apiextv1.CustomResourceDefinition) ([]*unstructured.Unstructured, error) {
	internal := map[string]bool{}
	if raw := csv.Annotations[AnnotationInternalObjects]; raw != "" {
		var names []string
		if err := json.Unmarshal([]byte(raw), &names); err != nil {
			return nil, fmt.Errorf("CSV base annotation %s: want a JSON array of CRD names: %w", AnnotationInternalObjects, err)
		}
		for _, n := range names {
			if crdNamed(crds, n) == nil {
				return nil, fmt.Errorf("CSV base annotation %s names %s, which is not an owned CRD", AnnotationInternalObjects, n)
			}
			internal[n] = true
		}
	}
	if rel == "" {
		return nil, nil
	}
	paths, err := manifest.YAMLFiles(dir, true)
	if err != nil {
		return nil, fmt.Errorf("listing internal examples: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		objs, err := manifest.Objects(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, o := range objs {
			if !servedBy(crds, o) {
				return nil, fmt.Errorf("%s: example %s %s is not a served version of an owned CRD", p, o.GetAPIVersion(), o.GetKind())
			}
			name := crdOf(crds, o).Name
			if !internal[name] {
				return nil, fmt.Errorf("%s: %s is an example of %s, which the CSV base does not list in %s; move it to the samples or list the CRD there", p, o.GetName(), name, AnnotationInternalObjects)
			}
			out = append(out, o)
		}
	}
	return out, nil
}

func crdNamed(crds []*apiextv1.CustomResourceDefinition, name string) *apiextv1.CustomResourceDefinition {
	for _, c := range crds {
		if c.Name == name {
			return c
		}
	}
	return nil
}

func crdOf(crds []*apiextv1.CustomResourceDefinition, o *unstructured.Unstructured) *apiextv1.CustomResourceDefinition {
	gvk := o.GroupVersionKind()
	for _, c := range crds {
		if c.Spec.Group == gvk.Group && c.Spec.Names.Kind == gvk.Kind {
			return c
		}
	}
	return nil
}

func servedBy(crds []*apiextv1.CustomResourceDefinition, o *unstructured.Unstructured) bool {
	gvk := o.GroupVersionKind()
	for _, c := range crds {
		if c.Spec.Group != gvk.Group || c.Spec.Names.Kind != gvk.Kind {
			continue
		}
		for _, v := range c.Spec.Versions {
			if v.Name == gvk.Version && v.Served {
				return true
			}
		}
	}
	return false
}

// samplesForExamples strips fields that have no place in an example.
func samplesForExamples(samples []*unstructured.Unstructured) []map[string]any {
	out := make([]map[string]any, 0, len(samples))
	for _, s := range samples {
		c := s.DeepCopy()
		c.SetNamespace("")
		delete(c.Object, "status")
		out = append(out, c.Object)
	}
	return out
}

func loadDeployment(path string) (*appsv1.Deployment, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading operator Deployment: %w", err)
	}
	docs, err := manifest.Documents(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var found *appsv1.Deployment
	for _, doc := range docs {
		var tm struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if tm.Kind != "Deployment" {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("%s: more than one Deployment", path)
		}
		found = &appsv1.Deployment{}
		if err := yaml.UnmarshalStrict(doc, found); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if found == nil {
		return nil, fmt.Errorf("%s: no Deployment", path)
	}
	return found, nil
}

func loadRules(path string) ([]rbacv1.PolicyRule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the operator's own rules: %w", err)
	}
	var role rbacv1.Role
	if err := yaml.UnmarshalStrict(data, &role); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(role.Rules) == 0 {
		return nil, fmt.Errorf("%s: no rules", path)
	}
	return role.Rules, nil
}

func loadExtra(dir string) ([]File, error) {
	paths, err := manifest.YAMLFiles(dir, true)
	if err != nil {
		return nil, err
	}
	var out []File
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		out = append(out, File{Name: filepath.Base(p), Data: data})
	}
	return out, nil
}

// RelatedImagePrefix starts the operator's environment variables that name
// an image it deploys.
const RelatedImagePrefix = "RELATED_IMAGE_"

// RelatedImageName turns RELATED_IMAGE_FOO_BAR into foo-bar.
func RelatedImageName(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, RelatedImagePrefix)), "_", "-")
}

// setImages points the operator container at this release's image and
// re-tags every RELATED_IMAGE_* variable that names one of the project's
// images. It returns the related images: the operator plus each variable.
func setImages(pod *corev1.PodSpec, cfg Config) ([]v1alpha1.RelatedImage, error) {
	if len(pod.Containers) == 0 {
		return nil, errors.New("the operator Deployment has no container")
	}
	related := map[string]string{cfg.OperatorImageName: cfg.OperatorImage()}
	pod.Containers[0].Image = cfg.OperatorImage()
	for ci := range pod.Containers {
		c := &pod.Containers[ci]
		for i := range c.Env {
			e := &c.Env[i]
			if !strings.HasPrefix(e.Name, RelatedImagePrefix) {
				continue
			}
			if e.ValueFrom != nil {
				return nil, fmt.Errorf("container %s: %s must be a literal image, not valueFrom", c.Name, e.Name)
			}
			if e.Value == "" {
				e.Value = cfg.ImageDefaults[e.Name]
			}
			if e.Value == "" {
				return nil, fmt.Errorf("container %s: %s has no value and no default image", c.Name, e.Name)
			}
			if strings.HasPrefix(e.Value, cfg.ImageRepository+"/") {
				e.Value = retag(e.Value, "v"+cfg.Version)
			}
			name := RelatedImageName(e.Name)
			if prev, ok := related[name]; ok && prev != e.Value {
				return nil, fmt.Errorf("related image %s is set twice to different images (%s, %s)", name, prev, e.Value)
			}
			related[name] = e.Value
		}
	}
	for _, env := range sortedKeys(cfg.ImageDefaults) {
		if _, ok := related[RelatedImageName(env)]; !ok {
			return nil, fmt.Errorf("the operator reads %s but its Deployment does not set it, so OLM could not point it at a mirrored image", env)
		}
	}
	out := make([]v1alpha1.RelatedImage, 0, len(related))
	for _, n := range sortedKeys(related) {
		out = append(out, v1alpha1.RelatedImage{Name: n, Image: related[n]})
	}
	return out, nil
}

// retag replaces the tag (or digest) of an image reference.
func retag(image, tag string) string {
	if i := strings.Index(image, "@"); i >= 0 {
		image = image[:i]
	}
	slash := strings.LastIndex(image, "/")
	if colon := strings.LastIndex(image, ":"); colon > slash {
		image = image[:colon]
	}
	return image + ":" + tag
}

// unrelatedImages lists rendered container images that the related images
// do not cover; disconnected installs would fail to pull them.
func unrelatedImages(objs []*unstructured.Unstructured, related []v1alpha1.RelatedImage) []string {
	known := map[string]bool{}
	for _, r := range related {
		known[r.Image] = true
	}
	missing := map[string]map[string]bool{}
	for _, o := range objs {
		for _, img := range containerImages(o.Object) {
			if !known[img] {
				if missing[img] == nil {
					missing[img] = map[string]bool{}
				}
				missing[img][o.GetKind()+" "+o.GetNamespace()+"/"+o.GetName()] = true
			}
		}
	}
	var notes []string
	for _, img := range sortedKeys(missing) {
		notes = append(notes, fmt.Sprintf("the chart renders image %q (in %s), which no RELATED_IMAGE_* variable names", img, strings.Join(sortedKeys(missing[img]), ", ")))
	}
	return notes
}

// containerImages finds every containers[].image and initContainers[].image
// anywhere in an object.
func containerImages(v any) []string {
	var out []string
	switch t := v.(type) {
	case map[string]any:
		for k, child := range t {
			if k == "containers" || k == "initContainers" {
				if list, ok := child.([]any); ok {
					for _, c := range list {
						if m, ok := c.(map[string]any); ok {
							if img, ok := m["image"].(string); ok {
								out = append(out, img)
							}
						}
					}
				}
				continue
			}
			out = append(out, containerImages(child)...)
		}
	case []any:
		for _, child := range t {
			out = append(out, containerImages(child)...)
		}
	}
	return out
}

// previousBelow returns the versions lower than v, ascending.
func previousBelow(vs []semver.Version, v semver.Version) []semver.Version {
	var out []semver.Version
	for _, p := range vs {
		if p.LT(v) {
			out = append(out, p)
		}
	}
	semver.Sort(out)
	return out
}

// ownedCRDs lists one owned entry per served version of every CRD, keeping
// the display names and descriptors written in the CSV base. A base entry
// for a CRD version that does not exist is an error: its descriptors would
// silently vanish.
func ownedCRDs(base []v1alpha1.CRDDescription, crds []*apiextv1.CustomResourceDefinition) ([]v1alpha1.CRDDescription, error) {
	type key struct{ name, version string }
	byKey := map[key]v1alpha1.CRDDescription{}
	for _, d := range base {
		byKey[key{d.Name, d.Version}] = d
	}
	used := map[key]bool{}
	var out []v1alpha1.CRDDescription
	sorted := append([]*apiextv1.CustomResourceDefinition(nil), crds...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	for _, crd := range sorted {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			k := key{crd.Name, v.Name}
			d := byKey[k]
			used[k] = true
			d.Name, d.Version, d.Kind = crd.Name, v.Name, crd.Spec.Names.Kind
			if d.DisplayName == "" {
				d.DisplayName = crd.Spec.Names.Kind
			}
			if d.Description == "" && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
				d.Description = firstSentence(v.Schema.OpenAPIV3Schema.Description)
			}
			out = append(out, d)
		}
	}
	for k := range byKey {
		if !used[k] {
			return nil, fmt.Errorf("owned CRD %s version %s is described in the CSV base but is not a served version of any CRD", k.name, k.version)
		}
	}
	return out, nil
}

func firstSentence(s string) string {
	s = strings.TrimSpace(strings.ReplaceAll(s, "\n", " "))
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

func iconMediaType(path string) string {
	switch strings.ToLower(filepath.Ext(path)) {
	case ".svg":
		return "image/svg+xml"
	case ".png":
		return "image/png"
	case ".jpg", ".jpeg":
		return "image/jpeg"
	case ".gif":
		return "image/gif"
	}
	return "application/octet-stream"
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// MarshalCSV writes a CSV as operator-sdk does: the operator-framework/api
// object without its status (OLM's to write) and without the zero
// creationTimestamp.
func MarshalCSV(csv *v1alpha1.ClusterServiceVersion) ([]byte, error) {
	js, err := json.Marshal(csv)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(js, &m); err != nil {
		return nil, err
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	return yaml.Marshal(m)
}
