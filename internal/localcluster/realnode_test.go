package localcluster_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/ociimage"
)

const helloImage = "localhost/hello:v1"

// buildHelloImage compiles testdata/hello statically and packs it.
func buildHelloImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./testdata/hello")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building testdata/hello: %v\n%s", err, out)
	}
	tarball := filepath.Join(dir, "hello.tar")
	if _, err := ociimage.Pack(ociimage.Options{Binary: bin, Ref: helloImage, Out: tarball, Ports: []string{"8080"}}); err != nil {
		t.Fatal(err)
	}
	return tarball
}

func helloPod(name string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "hello", Image: helloImage, ImagePullPolicy: corev1.PullNever, Args: args,
			}},
		},
	}
}

// waitPodSucceeded waits for a run-to-completion pod and fails the test
// with its log when it fails.
func waitPodSucceeded(t *testing.T, cs kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 2*time.Minute, func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase == corev1.PodFailed {
			logs, _ := cs.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
			t.Fatalf("pod %s failed: %s", name, logs)
		}
		if p.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("pod %s is %s, want Succeeded", name, p.Status.Phase)
		}
		return nil
	})
}

func TestRealNode(t *testing.T) {
	t.Parallel()
	localcluster.SkipUnderShort(t) // before building the image
	if runtime.GOOS != "linux" || os.Geteuid() != 0 {
		t.Skip("real-node mode needs Linux and root (it runs containerd, kubelet and iptables); run the tests as root to include it")
	}
	hello := buildHelloImage(t)
	c := localcluster.StartForTest(t, localcluster.Options{
		RealNode: true,
		GPUs:     2,
		Images:   []string{hello},
	})
	// What the host looked like before this cluster changed it, as the
	// cluster recorded it once it held the machine-wide lock. Sampling it
	// here, before StartForTest, would race with another package's real-node
	// cluster that is still running while this one waits for the lock.
	before, err := localcluster.ReadOwner()
	if err != nil {
		t.Fatalf("reading the cluster's record of the host: %v", err)
	}
	routeLocalnet, ok := before.Sysctls["net/ipv4/conf/all/route_localnet"]
	if !ok {
		t.Fatal("the cluster did not record route_localnet before changing it")
	}
	absent := before.CreatedPaths
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("NodeAdvertisesGPUs", func(t *testing.T) {
		node, err := cs.CoreV1().Nodes().Get(ctx, localcluster.DefaultNodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := node.Status.Allocatable[localcluster.ResourceGPU]; got.Value() != 2 {
			t.Errorf("allocatable %s = %s, want 2", localcluster.ResourceGPU, got.String())
		}
		if got := node.Labels[localcluster.LabelGPUProduct]; got != localcluster.DefaultGPUProduct {
			t.Errorf("label %s = %q, want %q", localcluster.LabelGPUProduct, got, localcluster.DefaultGPUProduct)
		}
	})

	t.Run("NodePortServesLocallyBuiltImage", func(t *testing.T) {
		labels := map[string]string{"app": "hello"}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "hello", Namespace: "default"},
			Spec: appsv1.DeploymentSpec{
				Replicas: new(int32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name: "hello", Image: helloImage, ImagePullPolicy: corev1.PullNever,
						Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(8080)}},
							PeriodSeconds: 1,
						},
						Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{localcluster.ResourceGPU: resource.MustParse("1")},
						},
					}}},
				},
			},
		}
		if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		svc, err := cs.CoreV1().Services("default").Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "hello"},
			Spec: corev1.ServiceSpec{
				Type:     corev1.ServiceTypeNodePort,
				Selector: labels,
				Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		url := fmt.Sprintf("http://127.0.0.1:%d/", svc.Spec.Ports[0].NodePort)
		client := &http.Client{Timeout: 2 * time.Second}
		eventually(t, 2*time.Minute, func() error {
			resp, err := client.Get(url)
			if err != nil {
				return fmt.Errorf("the NodePort does not answer: %w", err)
			}
			defer func() { _ = resp.Body.Close() }()
			body, _ := io.ReadAll(resp.Body)
			if !strings.HasPrefix(string(body), "hello from hello-") {
				return fmt.Errorf("%s answered %d %q, want hello from hello-…", url, resp.StatusCode, body)
			}
			return nil
		})
	})

	t.Run("PodResolvesServicesThroughClusterDNS", func(t *testing.T) {
		if _, err := cs.CoreV1().Pods("default").Create(ctx, helloPod("lookup", "lookup", "kubernetes.default.svc.cluster.local"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodSucceeded(t, cs, "lookup")
		logs, err := cs.CoreV1().Pods("default").GetLogs("lookup", &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(logs), "10.96.0.1") {
			t.Errorf("lookup of the kubernetes Service printed %q, want its ClusterIP 10.96.0.1", logs)
		}
	})

	t.Run("ClaimBindsAndNonRootPodWritesToIt", func(t *testing.T) {
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "data", Namespace: "default"},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources: corev1.VolumeResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				},
			},
		}
		if _, err := cs.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := helloPod("writer", "write", "/data/greeting")
		pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
		pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "data"},
		}}}
		if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPodSucceeded(t, cs, "writer")
		got, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, "data", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != corev1.ClaimBound {
			t.Fatalf("claim phase %s, want Bound", got.Status.Phase)
		}
		pv, err := cs.CoreV1().PersistentVolumes().Get(ctx, got.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(pv.Spec.HostPath.Path, "greeting"))
		if err != nil {
			t.Fatalf("the pod's file is not in the volume: %v", err)
		}
		if string(data) != "writer" {
			t.Errorf("volume file holds %q, want the pod's hostname %q", data, "writer")
		}
	})

	if t.Failed() {
		return
	}
	// Teardown must leave the host as it found it.
	workDir := c.WorkDir()
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if pids := localcluster.ProcessesUsing(workDir); len(pids) > 0 {
		t.Errorf("processes of the cluster still run after Stop: %v", pids)
	}
	for _, ipt := range []string{"iptables", "ip6tables"} {
		if chains := localcluster.OwnIPTablesChains(ipt); len(chains) > 0 {
			t.Errorf("%s chains left after Stop: %v", ipt, chains)
		}
	}
	if _, err := net.InterfaceByName("cni0"); err == nil {
		t.Error("the cni0 bridge is left after Stop")
	}
	if lo, err := net.InterfaceByName("lo"); err == nil {
		addrs, _ := lo.Addrs()
		for _, a := range addrs {
			if strings.HasPrefix(a.String(), "10.123.0.1/") {
				t.Errorf("lo still has %s after Stop", a)
			}
		}
	}
	if got := readSysctl(t, "net/ipv4/conf/all/route_localnet"); got != routeLocalnet {
		t.Errorf("route_localnet = %s after Stop, was %s before", got, routeLocalnet)
	}
	for _, p := range append([]string{localcluster.OwnerFile, workDir}, absent...) {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s is left after Stop", p)
		}
	}
	if netns, _ := filepath.Glob("/run/netns/cni-*"); len(netns) > 0 {
		t.Errorf("pod network namespaces left after Stop: %v", netns)
	}
}

func readSysctl(t *testing.T, key string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("/proc/sys", key))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}
