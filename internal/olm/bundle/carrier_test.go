package bundle

import (
	"bytes"
	"strings"
	"testing"
)

func TestCarrierShipsTheCurrentCRDsAndNothingElseChanges(t *testing.T) {
	from, err := Load("../../../catalog/bundles/0.2.0")
	if err != nil {
		t.Fatal(err)
	}
	current, err := Load("../../../bundle")
	if err != nil {
		t.Fatal(err)
	}
	c, err := Carrier(from, current, "0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	if c.CSV.Name != "orchestra-operator.v0.2.1" || c.CSV.Spec.Version.String() != "0.2.1" || c.CSV.Spec.Replaces != "orchestra-operator.v0.2.0" {
		t.Errorf("CSV %s version %s replaces %s", c.CSV.Name, c.CSV.Spec.Version, c.CSV.Spec.Replaces)
	}
	if got := c.CSV.Annotations["olm.skipRange"]; got != ">=0.1.0 <0.2.1" {
		t.Errorf("olm.skipRange = %q", got)
	}
	if got, want := c.CSV.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0].Image,
		from.CSV.Spec.InstallStrategy.StrategySpec.DeploymentSpecs[0].Spec.Template.Spec.Containers[0].Image; got != want {
		t.Errorf("operator image %s, want the line's %s", got, want)
	}
	if c.Package() != from.Package() || c.Annotations.Annotations["operators.operatorframework.io.bundle.channels.v1"] != from.Annotations.Annotations["operators.operatorframework.io.bundle.channels.v1"] {
		t.Errorf("annotations changed: %v", c.Annotations)
	}
	if len(c.CRDs) != len(from.CRDs) {
		t.Fatalf("%d CRDs, want the line's %d", len(c.CRDs), len(from.CRDs))
	}
	for _, f := range c.Files {
		if !strings.HasPrefix(f.Name, "modelorchestra.io_") {
			continue
		}
		for _, cf := range current.Files {
			if cf.Name == f.Name && !bytes.Equal(cf.Data, f.Data) {
				t.Errorf("%s differs from the current bundle's", f.Name)
			}
		}
	}

	for _, bad := range []string{"0.2.0", "0.1.9", "1.0.1", "x"} {
		if _, err := Carrier(from, current, bad); err == nil {
			t.Errorf("carrier version %s of 0.2.0 accepted", bad)
		}
	}
}
