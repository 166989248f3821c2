package manager_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls f every 50 ms until it passes (polltest.Eventually).
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, 50*time.Millisecond, f)
}

// origWD is the package directory, where the tests start.
var origWD, _ = os.Getwd()

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

func httpGet(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// createCRD creates crd and waits until the API server serves it.
func createCRD(t *testing.T, k8s client.Client, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, func() error {
		got := &apiextensionsv1.CustomResourceDefinition{}
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(crd), got); err != nil {
			return err
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("the CRD %s is not established: %v", crd.Name, got.Status.Conditions)
	})
	// Established comes before discovery lists the kind: a manager built at
	// once fails with "no matches for ..." on a loaded machine. Wait until
	// the REST mapping resolves every served version.
	eventually(t, 30*time.Second, func() error {
		gk := schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			if _, err := k8s.RESTMapper().RESTMapping(gk, v.Name); err != nil {
				return fmt.Errorf("discovery does not list %s/%s yet: %w", gk, v.Name, err)
			}
		}
		return nil
	})
}

// metricValue is the value of series (name{labels}) in a Prometheus text
// exposition, 0 when it is absent.
func metricValue(exposition, series string) float64 {
	for _, line := range strings.Split(exposition, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err == nil {
				return v
			}
		}
	}
	return 0
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// configMapColor returns nil once the ConfigMap ns/name has data color.
func configMapColor(ctx context.Context, k8s client.Client, ns, name, color string) error {
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cm); err != nil {
		return fmt.Errorf("ConfigMap %s: %w", name, err)
	}
	if got := cm.Data["color"]; got != color {
		return fmt.Errorf("ConfigMap %s has color %q, want %q", name, got, color)
	}
	return nil
}
