package crdcompat

import (
	"fmt"
	"os"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/olm/manifest"
)

// Load reads every CustomResourceDefinition in the YAML files of dir (for
// example config/crd/bases or a bundle's manifests/); other kinds are
// skipped.
func Load(dir string) ([]*apiextv1.CustomResourceDefinition, error) {
	paths, err := manifest.YAMLFiles(dir, false)
	if err != nil {
		return nil, err
	}
	var out []*apiextv1.CustomResourceDefinition
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		docs, err := manifest.Documents(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, doc := range docs {
			var head struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &head); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if head.Kind != "CustomResourceDefinition" {
				continue
			}
			crd := &apiextv1.CustomResourceDefinition{}
			if err := yaml.UnmarshalStrict(doc, crd); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			out = append(out, crd)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no CustomResourceDefinition in %s", dir)
	}
	return out, nil
}
