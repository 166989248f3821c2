package stack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// OperatorOptions describe an install of charts/orchestra-operator.
type OperatorOptions struct {
	// Kubeconfig is the kubeconfig file of the cluster.
	Kubeconfig string
	// ChartDir is the install chart's directory (charts/orchestra-operator).
	ChartDir  string
	Namespace string // default orchestra-system
	Release   string // default orchestra
	// Values are passed to the chart (nil: its defaults).
	Values map[string]any
	// Timeout bounds waiting for the operator Deployment (default 3m).
	Timeout time.Duration
}

func (o *OperatorOptions) defaults() {
	if o.Namespace == "" {
		o.Namespace = "orchestra-system"
	}
	if o.Release == "" {
		o.Release = "orchestra"
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
}

func helmConfig(kubeconfig, namespace string) (*action.Configuration, error) {
	settings := cli.New()
	settings.KubeConfig = kubeconfig
	settings.SetNamespace(namespace)
	cfg := new(action.Configuration)
	if err := cfg.Init(settings.RESTClientGetter(), namespace, "secret", func(string, ...any) {}); err != nil {
		return nil, fmt.Errorf("initialising helm for namespace %s: %w", namespace, err)
	}
	return cfg, nil
}

// InstallOperator installs (or upgrades) the operator release from its
// install chart, CRD included, and waits until the operator Deployment is
// available. On timeout the error carries the operator pods' state and logs.
func InstallOperator(ctx context.Context, cs kubernetes.Interface, o OperatorOptions, logf func(string, ...any)) error {
	o.defaults()
	chart, err := loader.Load(o.ChartDir)
	if err != nil {
		return fmt.Errorf("loading chart %s: %w", o.ChartDir, err)
	}
	cfg, err := helmConfig(o.Kubeconfig, o.Namespace)
	if err != nil {
		return err
	}
	values := o.Values
	if values == nil {
		values = map[string]any{}
	}
	hist, err := action.NewHistory(cfg).Run(o.Release)
	switch {
	case errors.Is(err, driver.ErrReleaseNotFound) || (err == nil && len(hist) == 0):
		inst := action.NewInstall(cfg)
		inst.ReleaseName = o.Release
		inst.Namespace = o.Namespace
		inst.CreateNamespace = true
		inst.Timeout = o.Timeout
		if _, err := inst.RunWithContext(ctx, chart, values); err != nil {
			return fmt.Errorf("installing chart %s as %s/%s: %w", chart.Name(), o.Namespace, o.Release, err)
		}
		logf("installed the operator: helm release %s/%s (chart %s %s)", o.Namespace, o.Release, chart.Name(), chart.Metadata.Version)
	case err != nil:
		return fmt.Errorf("reading helm history of %s/%s: %w", o.Namespace, o.Release, err)
	default:
		if st := hist[len(hist)-1].Info.Status; st != release.StatusDeployed {
			// A previous run interrupted mid-install left a pending or
			// failed release: remove it and install again.
			logf("removing the %s operator release %s/%s", st, o.Namespace, o.Release)
			if _, err := action.NewUninstall(cfg).Run(o.Release); err != nil {
				return fmt.Errorf("removing the unfinished release %s/%s: %w", o.Namespace, o.Release, err)
			}
			return InstallOperator(ctx, cs, o, logf)
		}
		up := action.NewUpgrade(cfg)
		up.Namespace = o.Namespace
		up.Timeout = o.Timeout
		if _, err := up.RunWithContext(ctx, o.Release, chart, values); err != nil {
			return fmt.Errorf("upgrading %s/%s with chart %s: %w", o.Namespace, o.Release, chart.Name(), err)
		}
		logf("operator release %s/%s is up to date (chart %s %s)", o.Namespace, o.Release, chart.Name(), chart.Metadata.Version)
	}
	return WaitOperator(ctx, cs, o.Namespace, o.Timeout, logf)
}

// WaitOperator waits until every Deployment in namespace (the operator's)
// has all its replicas updated and available.
func WaitOperator(ctx context.Context, cs kubernetes.Interface, namespace string, timeout time.Duration, logf func(string, ...any)) error {
	var pending string
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := cs.AppsV1().Deployments(namespace).List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) == 0 {
			pending = "no Deployment yet"
			return false, nil //nolint:nilerr // retried until the timeout
		}
		for i := range list.Items {
			if !deploymentAvailable(&list.Items[i]) {
				d := &list.Items[i]
				pending = fmt.Sprintf("deployment %s: %d/%d available", d.Name, d.Status.AvailableReplicas, ptrInt32(d.Spec.Replicas))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the operator in %s is not available (%s): %w\n%s", namespace, pending, err,
			DiagnosePods(context.WithoutCancel(ctx), cs, namespace, "", 30))
	}
	logf("operator is running in namespace %s", namespace)
	return nil
}

func deploymentAvailable(d *appsv1.Deployment) bool {
	want := ptrInt32(d.Spec.Replicas)
	return d.Status.ObservedGeneration >= d.Generation &&
		d.Status.UpdatedReplicas == want && d.Status.AvailableReplicas == want && d.Status.Replicas == want
}

func ptrInt32(p *int32) int32 {
	if p == nil {
		return 1
	}
	return *p
}

// UninstallOperator removes the operator release (the CRD is kept by the
// chart's resource policy) and waits until its pods are gone. A missing
// release is not an error.
func UninstallOperator(ctx context.Context, cs kubernetes.Interface, o OperatorOptions, logf func(string, ...any)) error {
	o.defaults()
	cfg, err := helmConfig(o.Kubeconfig, o.Namespace)
	if err != nil {
		return err
	}
	un := action.NewUninstall(cfg)
	un.Wait = false
	un.Timeout = o.Timeout
	if _, err := un.Run(o.Release); err != nil {
		if errors.Is(err, driver.ErrReleaseNotFound) {
			logf("operator release %s/%s is not installed", o.Namespace, o.Release)
			return nil
		}
		return fmt.Errorf("uninstalling %s/%s: %w", o.Namespace, o.Release, err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, o.Timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(o.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return apierrors.IsNotFound(err), nil
		}
		return len(pods.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the operator pods in %s to go: %w", o.Namespace, err)
	}
	logf("uninstalled the operator release %s/%s (the CRD is kept)", o.Namespace, o.Release)
	return nil
}

// ReleaseManifest returns the manifest of the latest revision of a helm
// release: for a ModelOrchestra, the release is named after the resource
// and lives in its namespace (docs/engine.md).
func ReleaseManifest(kubeconfig, namespace, name string) (string, error) {
	cfg, err := helmConfig(kubeconfig, namespace)
	if err != nil {
		return "", err
	}
	rel, err := action.NewGet(cfg).Run(name)
	if err != nil {
		return "", fmt.Errorf("reading helm release %s/%s: %w", namespace, name, err)
	}
	return rel.Manifest, nil
}
