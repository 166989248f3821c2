package lifecyclestate_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestTheGatewayLinksNoLifecycleCode: the gateway reads the lifecycle's
// state through this package alone, so its binary links none of the
// leader, the agents, the seat groups, the fetcher or an S3 client.
func TestTheGatewayLinksNoLifecycleCode(t *testing.T) {
	if testing.Short() {
		t.Skip("go list loads the gateway's whole dependency graph; skipped with -short")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/model-orchestra/operator/cmd/orchestra-gateway").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const mod = "github.com/model-orchestra/operator/internal/"
	forbidden := []string{"lifecycle", "checkpoint", "sidecar", "sidecarapi", "nodeagent", "nodeapi", "seatgroup", "fetch"}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if dep == mod+f || strings.HasPrefix(dep, mod+f+"/") {
				t.Errorf("the gateway links %s", dep)
			}
		}
		if strings.Contains(dep, "aws-sdk") || strings.HasPrefix(dep, "github.com/minio/minio-go") {
			t.Errorf("the gateway links an S3 client: %s", dep)
		}
	}
}
