package lifecycle

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/nodeapi"
)

func TestCheckpointNodesCarryTheNodeReports(t *testing.T) {
	now := time.Now()
	views := []nodeView{
		{agentRef: agentRef{node: "n1"}, report: nodeapi.NodeReport{Time: now,
			Runtime: nodeapi.RuntimeReport{Version: "containerd://1.7.24"}, ProcessSnapshotsReason: "runtime: containerd 1.7.24 does not implement CRI CheckpointContainer"}},
		{agentRef: agentRef{node: "n2"}}, // no report: the agent did not answer
		{agentRef: agentRef{node: "n3"}, report: nodeapi.NodeReport{Time: now, ProcessSnapshots: true,
			Runtime: nodeapi.RuntimeReport{Version: "containerd://2.0.1"}}},
		{agentRef: agentRef{node: "n4"}, report: nodeapi.NodeReport{Time: now, ProcessSnapshotsReason: strings.Repeat("é", 600)}},
	}
	got := checkpointNodes(views)
	if len(got) != 3 {
		t.Fatalf("%d nodes, want 3 (the agent without a report is left out): %+v", len(got), got)
	}
	want := []v1alpha1.CheckpointNode{
		{Node: "n1", ContainerRuntimeVersion: "containerd://1.7.24", ProcessSnapshotsReason: "runtime: containerd 1.7.24 does not implement CRI CheckpointContainer"},
		{Node: "n3", ContainerRuntimeVersion: "containerd://2.0.1", ProcessSnapshots: true},
	}
	if diff := cmp.Diff(want, got[:2]); diff != "" {
		t.Errorf("nodes (-want +got):\n%s", diff)
	}
	if r := got[2].ProcessSnapshotsReason; len(r) > 1024 || !strings.HasSuffix(r, "...") || !utf8.ValidString(r) {
		t.Errorf("a long reason is %d bytes (valid UTF-8 %v); want it cut to 1024, marked, still UTF-8", len(r), utf8.ValidString(r))
	}
}
