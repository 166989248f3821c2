package localcluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Storage: a default StorageClass served by a small provisioner that runs
// inside the process that started the cluster. Each claim gets a directory
// under <work dir>/volumes, mode 0777 so that non-root pods can write.
const (
	// StorageClassName is the default StorageClass.
	StorageClassName = "standard"
	// Provisioner is the provisioner name of StorageClassName.
	Provisioner = "localcluster.modelorchestra.io/hostpath"

	annProvisionedBy = "pv.kubernetes.io/provisioned-by"
	provisionPeriod  = time.Second
)

// startProvisioner creates the default StorageClass and starts the
// provisioner loop, which stops with bgCtx.
func (c *Cluster) startProvisioner(ctx, bgCtx context.Context, cs kubernetes.Interface) error {
	sc := &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        StorageClassName,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       Provisioner,
		ReclaimPolicy:     new(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: new(storagev1.VolumeBindingImmediate),
	}
	if _, err := cs.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating StorageClass %s: %w", StorageClassName, err)
	}
	logFile, err := os.OpenFile(filepath.Join(c.logDir, "provisioner.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p := &provisioner{
		cs:   cs,
		dir:  c.path("volumes"),
		log:  slog.New(slog.NewTextHandler(logFile, nil)),
		node: "",
	}
	if c.node != nil {
		p.node = c.opts.NodeName
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		defer func() { _ = logFile.Close() }()
		p.run(bgCtx)
	}()
	return nil
}

type provisioner struct {
	cs   kubernetes.Interface
	dir  string
	log  *slog.Logger
	node string // pin volumes to this node; empty without a real node
}

func (p *provisioner) run(ctx context.Context) {
	t := time.NewTicker(provisionPeriod)
	defer t.Stop()
	for {
		if err := p.sync(ctx); err != nil && ctx.Err() == nil {
			p.log.Error("sync failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sync provisions volumes for pending claims of our classes and deletes
// released volumes whose policy is Delete.
func (p *provisioner) sync(ctx context.Context) error {
	classes, err := p.cs.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing StorageClasses: %w", err)
	}
	ours := map[string]*storagev1.StorageClass{}
	for i := range classes.Items {
		if classes.Items[i].Provisioner == Provisioner {
			ours[classes.Items[i].Name] = &classes.Items[i]
		}
	}
	claims, err := p.cs.CoreV1().PersistentVolumeClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing PersistentVolumeClaims: %w", err)
	}
	var errs []error
	for i := range claims.Items {
		pvc := &claims.Items[i]
		if pvc.Spec.VolumeName != "" || pvc.Status.Phase != corev1.ClaimPending || pvc.DeletionTimestamp != nil {
			continue
		}
		if pvc.Spec.StorageClassName == nil || ours[*pvc.Spec.StorageClassName] == nil {
			continue
		}
		errs = append(errs, p.provision(ctx, pvc, ours[*pvc.Spec.StorageClassName]))
	}
	volumes, err := p.cs.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing PersistentVolumes: %w", err))...)
	}
	for i := range volumes.Items {
		pv := &volumes.Items[i]
		if pv.Annotations[annProvisionedBy] != Provisioner || pv.DeletionTimestamp != nil {
			continue
		}
		if pv.Status.Phase == corev1.VolumeReleased && pv.Spec.PersistentVolumeReclaimPolicy == corev1.PersistentVolumeReclaimDelete {
			errs = append(errs, p.delete(ctx, pv))
		}
	}
	return errors.Join(errs...)
}

func (p *provisioner) provision(ctx context.Context, pvc *corev1.PersistentVolumeClaim, sc *storagev1.StorageClass) error {
	size, ok := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return fmt.Errorf("claim %s/%s requests no storage", pvc.Namespace, pvc.Name)
	}
	name := "pvc-" + string(pvc.UID)
	dir := filepath.Join(p.dir, pvc.Namespace+"-"+pvc.Name+"-"+string(pvc.UID))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating volume directory: %w", err)
	}
	// The umask would narrow MkdirAll's mode; any pod user must be able to write.
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if sc.ReclaimPolicy != nil {
		reclaim = *sc.ReclaimPolicy
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{annProvisionedBy: Provisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   pvc.Spec.AccessModes,
			VolumeMode:                    pvc.Spec.VolumeMode,
			StorageClassName:              sc.Name,
			PersistentVolumeReclaimPolicy: reclaim,
			ClaimRef: &corev1.ObjectReference{
				Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: pvc.Namespace, Name: pvc.Name, UID: pvc.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: new(corev1.HostPathDirectory)},
			},
		},
	}
	if p.node != "" {
		pv.Spec.NodeAffinity = &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
				Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{p.node},
			}}}},
		}}
	}
	if _, err := p.cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("creating PersistentVolume for claim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	p.log.Info("provisioned", "claim", pvc.Namespace+"/"+pvc.Name, "volume", name, "path", dir)
	return nil
}

func (p *provisioner) delete(ctx context.Context, pv *corev1.PersistentVolume) error {
	if pv.Spec.HostPath != nil {
		path := filepath.Clean(pv.Spec.HostPath.Path)
		// Only ever remove directories this provisioner made.
		if strings.HasPrefix(path, filepath.Clean(p.dir)+string(filepath.Separator)) {
			if err := os.RemoveAll(path); err != nil {
				return fmt.Errorf("removing volume directory %s: %w", path, err)
			}
		}
	}
	err := p.cs.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PersistentVolume %s: %w", pv.Name, err)
	}
	p.log.Info("deleted", "volume", pv.Name)
	return nil
}
