package localcluster

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestOptionsValidate(t *testing.T) {
	bin := t.TempDir()
	for _, tc := range []struct {
		name    string
		opts    Options
		wantErr string
	}{
		{name: "bare control plane", opts: Options{BinDir: bin}},
		{name: "kwok nodes", opts: Options{BinDir: bin, KwokNodes: []KwokNode{{Name: "a"}, {Name: "b", GPUs: 8}}}},
		{name: "unnamed kwok node", opts: Options{BinDir: bin, KwokNodes: []KwokNode{{}}}, wantErr: "has no name"},
		{name: "duplicate node", opts: Options{BinDir: bin, KwokNodes: []KwokNode{{Name: "a"}, {Name: "a"}}}, wantErr: "used twice"},
		{name: "kwok node named like the real node", opts: Options{BinDir: bin, RealNode: true, KwokNodes: []KwokNode{{Name: DefaultNodeName}}}, wantErr: "used twice"},
		{name: "bad cpu", opts: Options{BinDir: bin, KwokNodes: []KwokNode{{Name: "a", CPU: "lots"}}}, wantErr: "cpu"},
		{name: "negative GPUs", opts: Options{BinDir: bin, KwokNodes: []KwokNode{{Name: "a", GPUs: -1}}}, wantErr: "negative"},
		{name: "images without a real node", opts: Options{BinDir: bin, Images: []string{"x.tar"}}, wantErr: "RealNode"},
		{name: "missing image", opts: Options{BinDir: bin, RealNode: true, Images: []string{bin + "/missing.tar"}}, wantErr: "missing.tar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Default().Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestOptionsDefault(t *testing.T) {
	t.Setenv(EnvBinDir, "/opt/k8s/bin")
	got := Options{RealNode: true, KwokNodes: []KwokNode{{Name: "gpu", GPUs: 2}}}.Default()
	if got.BinDir != "/opt/k8s/bin" {
		t.Errorf("BinDir = %q, want $%s", got.BinDir, EnvBinDir)
	}
	if !got.ControllerManager || !got.Scheduler {
		t.Error("a real node needs the controller-manager and the scheduler")
	}
	want := KwokNode{Name: "gpu", GPUs: 2, CPU: DefaultKwokCPU, Memory: DefaultKwokMemory, GPUProduct: DefaultGPUProduct}
	if diff := cmp.Diff(want, got.KwokNodes[0]); diff != "" {
		t.Errorf("kwok node defaults (-want +got):\n%s", diff)
	}
	if got.StartTimeout != realNodeTimeout {
		t.Errorf("StartTimeout = %s, want %s for a real node", got.StartTimeout, realNodeTimeout)
	}
}

func TestKwokNodeObjectAdvertisesGPUs(t *testing.T) {
	n, err := kwokNodeObject(KwokNode{Name: "gpu-0", CPU: "16", Memory: "64Gi", GPUs: 8, GPUProduct: "NVIDIA-A100", Labels: map[string]string{"pool": "a"}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Status.Capacity[ResourceGPU]; got.Value() != 8 {
		t.Errorf("capacity %s = %s, want 8", ResourceGPU, got.String())
	}
	if got := n.Status.Allocatable[ResourceGPU]; got.Value() != 8 {
		t.Errorf("allocatable %s = %s, want 8", ResourceGPU, got.String())
	}
	wantLabels := map[string]string{
		"kubernetes.io/hostname": "gpu-0", "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
		LabelNodeType: "kwok", LabelGPUProduct: "NVIDIA-A100", LabelGPUCount: "8", "pool": "a",
	}
	if diff := cmp.Diff(wantLabels, n.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if n.Annotations[AnnotationKwokNode] != "fake" {
		t.Errorf("node is not marked for kwok: %v", n.Annotations)
	}
	cpuOnly, err := kwokNodeObject(KwokNode{Name: "cpu-0", CPU: "4", Memory: "8Gi"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cpuOnly.Status.Capacity[ResourceGPU]; ok {
		t.Error("a node without GPUs advertises nvidia.com/gpu")
	}
	if n.Status.Addresses[0].Address == cpuOnly.Status.Addresses[0].Address {
		t.Errorf("two nodes share the address %s", n.Status.Addresses[0].Address)
	}
}
