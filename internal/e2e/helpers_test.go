package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/model-orchestra/operator/internal/e2e/stack"
	"github.com/model-orchestra/operator/internal/polltest"
)

// eventually polls f every second until it passes (polltest.Eventually).
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, time.Second, f)
}

// simulatorResource is config/samples/simulator.yaml as ns/name, with its
// model mirrored from the test hub and its gateway on a NodePort, as every
// test here starts from it.
func simulatorResource(t *testing.T, ns, name string) *unstructured.Unstructured {
	t.Helper()
	obj, err := stack.LoadResource(filepath.Join(env.root, "config", "samples", "simulator.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	obj.SetName(name)
	obj.SetNamespace(ns)
	must(t, stack.MirrorModel(obj, env.hub))
	must(t, unstructured.SetNestedField(obj.Object, "NodePort", "spec", "gateway", "service", "type"))
	return obj
}
