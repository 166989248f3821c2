package nodeagent

import (
	"strings"
	"testing"
)

func TestCRICheckpointSupport(t *testing.T) {
	for _, c := range []struct {
		in     string
		ok     bool
		reason string
	}{
		{"containerd://1.6.20", false, "containerd 1.6.20 does not implement CRI CheckpointContainer"},
		{"containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3", false, "containerd 1.6.20 does not"},
		{"containerd://2.0.1", true, "restore through CreateContainer is deprecated and not used"},
		{"containerd containerd.io v2.1.0 abc", true, "containerd 2.1.0 implements"},
		{"cri-o://1.30.2", true, "enable_criu_support"},
		{"cri-o://1.24.0", false, "predates"},
		{"docker://24.0.0", false, "not known"},
		{"", false, "--runtime-version"},
		{"containerd://dev", false, "cannot read a version"},
	} {
		ok, reason := CRICheckpointSupport(c.in)
		if ok != c.ok || !strings.Contains(reason, c.reason) {
			t.Errorf("%q: %v %q, want %v containing %q", c.in, ok, reason, c.ok, c.reason)
		}
	}
}
