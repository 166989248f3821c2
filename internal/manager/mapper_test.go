package manager

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// countingMapper answers one kind and counts the questions.
type countingMapper struct {
	meta.RESTMapper
	calls int
	scope meta.RESTScope
}

func (c *countingMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	c.calls++
	if gk.Kind != "Sample" {
		return nil, &meta.NoKindMatchError{GroupKind: gk, SearchedVersions: versions}
	}
	return &meta.RESTMapping{Resource: schema.GroupVersionResource{Group: gk.Group, Version: "v1", Resource: "samples"},
		GroupVersionKind: gk.WithVersion("v1"), Scope: c.scope}, nil
}

func TestCachedMapper(t *testing.T) {
	inner := &countingMapper{scope: meta.RESTScopeNamespace}
	now := time.Unix(0, 0)
	m := &cachedMapper{RESTMapper: inner, now: func() time.Time { return now }}
	gk := schema.GroupKind{Group: "test.modelorchestra.io", Kind: "Sample"}
	for range 3 {
		got, err := m.RESTMapping(gk, "v1")
		if err != nil || got.Scope.Name() != meta.RESTScopeNameNamespace {
			t.Fatalf("RESTMapping = %v, %v", got, err)
		}
		got.Scope = meta.RESTScopeRoot // a caller changing its copy changes nothing
	}
	if inner.calls != 1 {
		t.Errorf("the dynamic mapper was asked %d times, want once", inner.calls)
	}
	// A kind the cluster does not serve is asked about every time: it may
	// be installed any moment.
	for range 2 {
		if _, err := m.RESTMapping(schema.GroupKind{Kind: "Missing"}, "v1"); !meta.IsNoMatchError(err) {
			t.Fatalf("err = %v, want no match", err)
		}
	}
	if inner.calls != 3 {
		t.Errorf("calls = %d, want 3: errors must not be cached", inner.calls)
	}
	// After the TTL the mapping is asked again, and a changed scope shows.
	inner.scope = meta.RESTScopeRoot
	now = now.Add(mappingTTL + time.Second)
	if got, _ := m.RESTMapping(gk, "v1"); got.Scope.Name() != meta.RESTScopeNameRoot || inner.calls != 4 {
		t.Errorf("after the TTL: scope %v, calls %d; want root, 4", got.Scope.Name(), inner.calls)
	}
}
