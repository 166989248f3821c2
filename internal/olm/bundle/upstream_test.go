package bundle

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/model-orchestra/operator/internal/olm/check"
)

// TestCommittedBundlesPassUpstream runs operator-framework's validators on
// the committed bundles: 0 errors and 0 warnings.
func TestCommittedBundlesPassUpstream(t *testing.T) {
	for _, dir := range []string{"../../../bundle", "../../../catalog/bundles/0.1.0", "../../../catalog/bundles/0.2.0"} {
		rep, err := ValidateUpstream(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.Findings) != 0 {
			var buf bytes.Buffer
			_ = rep.Print(&buf)
			t.Errorf("%s:\n%s", dir, buf.String())
		}
	}
}

// TestValidateUpstreamRunsTheSuites breaks the valid fixture bundle on disk
// in one way per case and checks that the operator-framework validator
// named by the rule reports it: the default validators and every optional
// suite of operatorframework are really run.
func TestValidateUpstreamRunsTheSuites(t *testing.T) {
	csvFile := "widget-operator.clusterserviceversion.yaml"
	valid := t.TempDir()
	if err := generate(t).Bundle.Write(valid); err != nil {
		t.Fatal(err)
	}
	if rep, err := ValidateUpstream(valid); err != nil || len(rep.Findings) != 0 {
		t.Fatalf("the valid fixture: err %v, findings %v", err, rep.Findings)
	}
	tests := []struct {
		rule     string
		severity check.Severity
		file     string // in manifests/; created if new
		old, new string // old == "": new is the whole file
	}{
		{"csv", check.Error, csvFile, "minKubeVersion: 1.29.0", "minKubeVersion: one"},
		{"csv", check.Error, csvFile, "name: widget-operator.v1.2.0", "name: Widget_Operator.v1.2.0"},
		{"crd", check.Error, "example.io_widgets.yaml", "storage: true", "storage: false"},
		{"bundle", check.Error, csvFile, "kind: Widget\n", "kind: Gadget\n"},
		{"operatorhubv2", check.Error, csvFile, "mediatype: image/svg+xml", "mediatype: image/bmp"},
		{"capabilities", check.Error, csvFile, "capabilities: Basic Install", "capabilities: Magic"},
		{"categories", check.Error, csvFile, "categories: Developer Tools", "categories: Toys"},
		{"alpha-deprecated-apis", check.Error, "pdb.yaml", "", "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata:\n  name: pdb\nspec:\n  minAvailable: 1\n"},
		{"good-practices", check.Warning, csvFile, "                resources:\n", "                resourcesNot:\n"},
	}
	for _, tc := range tests {
		t.Run(tc.rule+"/"+tc.new, func(t *testing.T) {
			dir := t.TempDir()
			if err := generate(t).Bundle.Write(dir); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "manifests", tc.file)
			data := []byte(tc.new)
			if tc.old != "" {
				orig, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Contains(orig, []byte(tc.old)) {
					t.Fatalf("%s does not contain %q:\n%s", tc.file, tc.old, orig)
				}
				data = bytes.Replace(orig, []byte(tc.old), []byte(tc.new), 1)
			}
			if err := os.WriteFile(path, data, 0o644); err != nil {
				t.Fatal(err)
			}
			rep, err := ValidateUpstream(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Rules(tc.severity); !strings.Contains(" "+strings.Join(got, " ")+" ", " "+tc.rule+" ") {
				t.Fatalf("no %s from %s; findings: %v", tc.severity, tc.rule, rep.Findings)
			}
		})
	}
}
