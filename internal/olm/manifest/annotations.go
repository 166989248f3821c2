package manifest

import "sort"

// Bundle annotation keys (metadata/annotations.yaml and bundle.Dockerfile
// labels), as operator-registry's bundle generator writes them.
const (
	AnnotationMediaType      = "operators.operatorframework.io.bundle.mediatype.v1"
	AnnotationManifests      = "operators.operatorframework.io.bundle.manifests.v1"
	AnnotationMetadata       = "operators.operatorframework.io.bundle.metadata.v1"
	AnnotationPackage        = "operators.operatorframework.io.bundle.package.v1"
	AnnotationChannels       = "operators.operatorframework.io.bundle.channels.v1"
	AnnotationDefaultChannel = "operators.operatorframework.io.bundle.channel.default.v1"

	// MediaTypeRegistryV1 is the only bundle format OLM v0 and v1 install.
	MediaTypeRegistryV1 = "registry+v1"
	// ManifestsDir and MetadataDir are the bundle directories, with the
	// trailing slash the annotations carry.
	ManifestsDir = "manifests/"
	MetadataDir  = "metadata/"

	// LabelIndexConfigs is the catalog image label naming the FBC root.
	LabelIndexConfigs = "operators.operatorframework.io.index.configs.v1"
)

// RequiredBundleAnnotations are the keys every bundle must carry.
var RequiredBundleAnnotations = []string{AnnotationMediaType, AnnotationManifests, AnnotationMetadata, AnnotationPackage, AnnotationChannels}

// BundleAnnotations is the content of metadata/annotations.yaml.
type BundleAnnotations struct {
	Annotations map[string]string `json:"annotations"`
}

// SortedKeys returns the annotation keys in a stable order: the
// operator-registry keys in their documented order, then the rest sorted.
func (a BundleAnnotations) SortedKeys() []string {
	order := []string{AnnotationMediaType, AnnotationManifests, AnnotationMetadata, AnnotationPackage, AnnotationChannels, AnnotationDefaultChannel}
	var keys []string
	seen := map[string]bool{}
	for _, k := range order {
		if _, ok := a.Annotations[k]; ok {
			keys = append(keys, k)
			seen[k] = true
		}
	}
	var rest []string
	for k := range a.Annotations {
		if !seen[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	return append(keys, rest...)
}
