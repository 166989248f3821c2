package localcluster

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSplitRule(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{`-N KUBE-SERVICES`, []string{"-N", "KUBE-SERVICES"}},
		{
			`-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES`,
			[]string{"-A", "PREROUTING", "-m", "comment", "--comment", "kubernetes service portals", "-j", "KUBE-SERVICES"},
		},
		{
			`-A POSTROUTING -s 10.244.0.5/32 -m comment --comment "name: \"localcluster\" id: \"abc\"" -j CNI-123`,
			[]string{"-A", "POSTROUTING", "-s", "10.244.0.5/32", "-m", "comment", "--comment", `name: "localcluster" id: "abc"`, "-j", "CNI-123"},
		},
		{``, nil},
	} {
		if diff := cmp.Diff(tc.want, splitRule(tc.line)); diff != "" {
			t.Errorf("splitRule(%q) (-want +got):\n%s", tc.line, diff)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/with\040space/x`); got != "/tmp/with space/x" {
		t.Errorf("unescapeMount = %q", got)
	}
}
