package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/model-orchestra/operator/internal/ociimage"
)

// relayImage is the image of the plain relay pods (relaypod), built by the
// benchmark itself: it is no part of the product.
const relayImage = "ghcr.io/model-orchestra/bench-relay:test"

// relayViaHeader is relaypod's ViaHeader.
const relayViaHeader = "X-Relay-Via"

// relayCPU are the CPU requests of the three relay pods: those of the
// gateway, NATS and dispatcher pods they stand for (the charts' defaults),
// so that they get the same share of the node's CPU.
var relayCPU = []string{"100m", "100m", "50m"}

// startRelays builds relaypod, imports it into the real node and runs three
// relay pods in ns; it returns their addresses (pod IP:8080) in order.
func startRelays(ctx context.Context, t *testing.T, ns string) []string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "relaypod")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", bin, "./internal/e2e/relaypod")
	build.Dir = env.root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the relay pod's binary: %v\n%s", err, out)
	}
	tarball := filepath.Join(dir, "relay.tar")
	if _, err := ociimage.Pack(ociimage.Options{Binary: bin, Ref: relayImage, Out: tarball}); err != nil {
		t.Fatal(err)
	}
	if err := env.cluster.ImportImage(ctx, tarball); err != nil {
		t.Fatal(err)
	}
	for i, cpu := range relayCPU {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("relay-%d", i), Namespace: ns, Labels: map[string]string{"bench": "relay"}},
			Spec: corev1.PodSpec{
				AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{
					Name: "relay", Image: relayImage, ImagePullPolicy: corev1.PullNever,
					Env: []corev1.EnvVar{{Name: "GOGC", Value: "400"}}, // as the data-plane binaries set it
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
						corev1.ResourceCPU: resource.MustParse(cpu), corev1.ResourceMemory: resource.MustParse("32Mi"),
					}},
					ReadinessProbe: &corev1.Probe{
						ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}},
						PeriodSeconds: 1,
					},
					SecurityContext: &corev1.SecurityContext{
						AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true), RunAsNonRoot: ptr.To(true),
						Capabilities:   &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
				}},
			},
		}
		if _, err := env.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	addrs := make([]string, len(relayCPU))
	eventually(t, 2*time.Minute, func() error {
		for i := range relayCPU {
			p, err := env.cs.CoreV1().Pods(ns).Get(ctx, fmt.Sprintf("relay-%d", i), metav1.GetOptions{})
			if err != nil {
				return err
			}
			ready := false
			for _, c := range p.Status.Conditions {
				ready = ready || (c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue)
			}
			if !ready || p.Status.PodIP == "" {
				return fmt.Errorf("relay pod %s is not ready", p.Name)
			}
			addrs[i] = p.Status.PodIP + ":8080"
		}
		return nil
	})
	return addrs
}

// relayVia is the X-Relay-Via header that sends a request through the
// relays after the first to the engine at target.
func relayVia(relays []string, target string) string {
	return strings.Join(append(append([]string(nil), relays[1:]...), target), ",")
}
