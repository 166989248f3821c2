package localcluster_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/model-orchestra/operator/internal/localcluster"
)

func TestControlPlane(t *testing.T) {
	t.Parallel()
	c := localcluster.StartForTest(t, localcluster.Options{
		ControllerManager: true,
		Scheduler:         true,
		KwokNodes: []localcluster.KwokNode{
			{Name: "cpu-0"},
			{Name: "gpu-0", GPUs: 4, GPUProduct: "NVIDIA-H100-80GB-HBM3", Labels: map[string]string{"pool": "gpu"}},
		},
	})
	cs, err := kubernetes.NewForConfig(c.Config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	t.Run("GPUNodeAdvertisesGPUs", func(t *testing.T) {
		node, err := cs.CoreV1().Nodes().Get(ctx, "gpu-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := node.Status.Allocatable[localcluster.ResourceGPU]; got.Value() != 4 {
			t.Errorf("allocatable %s = %s, want 4", localcluster.ResourceGPU, got.String())
		}
		if got := node.Labels[localcluster.LabelGPUProduct]; got != "NVIDIA-H100-80GB-HBM3" {
			t.Errorf("label %s = %q, want NVIDIA-H100-80GB-HBM3", localcluster.LabelGPUProduct, got)
		}
		if got := node.Labels["pool"]; got != "gpu" {
			t.Errorf("label pool = %q, want gpu", got)
		}
	})

	t.Run("DeploymentBecomesAvailableOnGPUNode", func(t *testing.T) {
		labels := map[string]string{"app": "inference"}
		dep := &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Name: "inference", Namespace: "default"},
			Spec: appsv1.DeploymentSpec{
				Replicas: new(int32(2)),
				Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{{
						Name:  "server",
						Image: "example.com/inference:v1",
						Resources: corev1.ResourceRequirements{
							Limits: corev1.ResourceList{localcluster.ResourceGPU: resource.MustParse("2")},
						},
					}}},
				},
			},
		}
		if _, err := cs.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, func() error {
			d, err := cs.AppsV1().Deployments("default").Get(ctx, "inference", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range d.Status.Conditions {
				if cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue && d.Status.ReadyReplicas == 2 {
					return nil
				}
			}
			return fmt.Errorf("Deployment inference: %d of 2 replicas ready, conditions %v", d.Status.ReadyReplicas, d.Status.Conditions)
		})
		pods, err := cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=inference"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "gpu-0" {
				t.Errorf("pod %s asks for GPUs but runs on %q", p.Name, p.Spec.NodeName)
			}
			if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
				t.Errorf("pod %s: phase %s, IP %q; want Running with an IP", p.Name, p.Status.Phase, p.Status.PodIP)
			}
		}
	})

	t.Run("JobCompletes", func(t *testing.T) {
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: "download", Namespace: "default"},
			Spec: batchv1.JobSpec{
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "fetch", Image: "example.com/fetch:v1"}},
				}},
			},
		}
		if _, err := cs.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, func() error {
			j, err := cs.BatchV1().Jobs("default").Get(ctx, "download", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, cond := range j.Status.Conditions {
				if cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue && j.Status.Succeeded == 1 {
					return nil
				}
			}
			return fmt.Errorf("Job download: %d succeeded, conditions %v; want Complete with 1", j.Status.Succeeded, j.Status.Conditions)
		})
	})

	t.Run("GarbageCollectorDeletesDependents", func(t *testing.T) {
		owner, err := cs.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: "owner"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "dependent", OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID,
			}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := cs.CoreV1().ConfigMaps("default").Delete(ctx, "owner", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, func() error {
			_, err := cs.CoreV1().Secrets("default").Get(ctx, "dependent", metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return nil
			case err != nil:
				return err
			default:
				return errors.New("the dependent Secret is not garbage collected")
			}
		})
	})

	t.Run("ImpersonatedServiceAccountFollowsRBAC", func(t *testing.T) {
		ns := "rbac-test"
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "operator"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "configmap-reader"},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "operator-reads-configmaps"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "configmap-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "operator", Namespace: ns}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sa, err := kubernetes.NewForConfig(c.ImpersonateServiceAccount(ns, "operator"))
		if err != nil {
			t.Fatal(err)
		}
		// The API server's RBAC authorizer learns the new binding from its
		// informer a moment after the create returns.
		eventually(t, 30*time.Second, func() error {
			if _, err := sa.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{}); err != nil {
				return fmt.Errorf("listing configmaps as the ServiceAccount: %w; want allowed", err)
			}
			return nil
		})
		_, err = sa.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("listing secrets as the ServiceAccount: err = %v; want Forbidden", err)
		}
		err = sa.CoreV1().ConfigMaps(ns).Delete(ctx, "kube-root-ca.crt", metav1.DeleteOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("deleting a configmap as the ServiceAccount: err = %v; want Forbidden", err)
		}
		if err != nil && !strings.Contains(err.Error(), "system:serviceaccount:"+ns+":operator") {
			t.Errorf("denial %q does not name the ServiceAccount", err)
		}
	})

	t.Run("PersistentVolumeClaimBinds", func(t *testing.T) {
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "model-cache", Namespace: "default"},
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
		eventually(t, time.Minute, func() error {
			got, err := cs.CoreV1().PersistentVolumeClaims("default").Get(ctx, "model-cache", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got.Spec.StorageClassName == nil || *got.Spec.StorageClassName != localcluster.StorageClassName {
				return fmt.Errorf("claim has storage class %v, want the default %q", got.Spec.StorageClassName, localcluster.StorageClassName)
			}
			if got.Status.Phase != corev1.ClaimBound {
				return fmt.Errorf("claim model-cache is %s, want Bound", got.Status.Phase)
			}
			return nil
		})
	})
}

func TestStartFailsClearlyWithoutBinaries(t *testing.T) {
	t.Setenv(localcluster.EnvKubebuilderAssets, "")
	_, err := localcluster.Start(context.Background(), localcluster.Options{BinDir: t.TempDir()})
	if !errors.Is(err, localcluster.ErrBinaryNotFound) {
		t.Fatalf("Start with an empty BinDir: err = %v, want ErrBinaryNotFound", err)
	}
	if !strings.Contains(err.Error(), "make tools") {
		t.Errorf("error %q does not say how to get the binaries", err)
	}
}
