package bundle

import (
	"fmt"

	"github.com/operator-framework/api/pkg/manifests"
	"github.com/operator-framework/api/pkg/validation"
	"github.com/operator-framework/api/pkg/validation/errors"
	interfaces "github.com/operator-framework/api/pkg/validation/interfaces"

	"github.com/model-orchestra/operator/internal/olm/check"
)

// KubeVersion is the Kubernetes version the alpha-deprecated-apis validator
// checks the bundle against: the newest version this project supports.
const KubeVersion = "1.36"

// upstreamValidators are what `operator-sdk bundle validate
// --select-optional suite=operatorframework` runs after the format check:
// the default validators, then the optional suite. The name is the rule
// findings carry.
var upstreamValidators = []struct {
	name      string
	validator interfaces.Validator
}{
	{"csv", validation.ClusterServiceVersionValidator},
	{"crd", validation.CustomResourceDefinitionValidator},
	{"bundle", validation.BundleValidator},
	{"operatorhubv2", validation.OperatorHubV2Validator},
	{"capabilities", validation.StandardCapabilitiesValidator},
	{"categories", validation.StandardCategoriesValidator},
	{"alpha-deprecated-apis", validation.AlphaDeprecatedAPIsValidator},
	{"good-practices", validation.GoodPracticesValidator},
}

// ValidateUpstream checks the bundle directory dir with
// operator-framework/api: the bundle loaded by its pkg/manifests, then its
// pkg/validation default validators (CSV, CRD, bundle) and the
// operatorframework suite (OperatorHub v2, capabilities, categories,
// deprecated APIs for KubeVersion, good practices): what `operator-sdk
// bundle validate --select-optional suite=operatorframework
// --optional-values=k8s-version=KubeVersion` runs after its format check.
// Each finding's rule is the validator's name above.
func ValidateUpstream(dir string) (check.Report, error) {
	var r check.Report
	b, err := manifests.GetBundleFromDir(dir)
	if err != nil {
		return r, fmt.Errorf("loading bundle %s with operator-framework/api: %w", dir, err)
	}
	objs := append(b.ObjectsToValidate(), map[string]string{"k8s-version": KubeVersion})
	for _, uv := range upstreamValidators {
		for _, res := range uv.validator.Validate(objs...) {
			for _, e := range res.Errors {
				add(&r, uv.name, res.Name, e)
			}
			for _, e := range res.Warnings {
				add(&r, uv.name, res.Name, e)
			}
		}
	}
	return r, nil
}

func add(r *check.Report, rule, object string, e errors.Error) {
	if e.Level == errors.LevelError {
		r.Errorf(rule, object, "%s", e.Error())
		return
	}
	r.Warnf(rule, object, "%s", e.Error())
}
