package bundle

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestScanChartKindsReadsSubcharts: given a chart directory, the scan
// finds the kinds in the subcharts' templates too, and ignores values
// files, which hold no objects.
func TestScanChartKindsReadsSubcharts(t *testing.T) {
	root := t.TempDir()
	for path, content := range map[string]string{
		"Chart.yaml":                           "apiVersion: v2\nname: umbrella\nversion: 1.0.0\n",
		"values.yaml":                          "apiVersion: not/an-object\nkind: Values\n",
		"templates/cm.yaml":                    "apiVersion: v1\nkind: ConfigMap\n",
		"charts/web/templates/route.yaml":      "{{- if .Values.route }}\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\n{{- end }}\n",
		"charts/web/ci/all-values.yaml":        "apiVersion: not/an-object\nkind: CIValues\n",
		"charts/db/templates/statefulset.yaml": "apiVersion: apps/v1\nkind: StatefulSet\n---\napiVersion: v1\nkind: Service\n",
	} {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kinds, unresolved, err := ScanChartKinds(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []schema.GroupVersionKind{
		{Version: "v1", Kind: "ConfigMap"},
		{Version: "v1", Kind: "Service"},
		{Group: "apps", Version: "v1", Kind: "StatefulSet"},
		{Group: "gateway.networking.k8s.io", Version: "v1", Kind: "HTTPRoute"},
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("kinds (-want +got):\n%s", diff)
	}
	if len(unresolved) != 0 {
		t.Errorf("unresolved = %v, want none", unresolved)
	}
}
