package helmreconciler

import (
	"reflect"
	"testing"
)

func TestContains(t *testing.T) {
	live := map[string]any{
		"metadata": map[string]any{"name": "a", "labels": map[string]any{"x": "1", "added": "by-someone"}},
		"spec": map[string]any{
			"replicas": int64(2),
			"template": map[string]any{"spec": map[string]any{"containers": []any{
				map[string]any{"name": "app", "image": "i:1", "terminationMessagePath": "/dev/termination-log"},
			}}},
		},
	}
	tests := []struct {
		name string
		want map[string]any
		ok   bool
	}{
		{"fields others add are ignored", map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "1"}}}, true},
		{"server defaults inside lists are ignored", map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "app", "image": "i:1"}}}}}}, true},
		{"a changed value is drift", map[string]any{"spec": map[string]any{"replicas": int64(3)}}, false},
		{"a float equal to the int is not drift", map[string]any{"spec": map[string]any{"replicas": float64(2)}}, true},
		{"a removed label is drift", map[string]any{"metadata": map[string]any{"labels": map[string]any{"y": "2"}}}, false},
		{"a changed list element is drift", map[string]any{"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"image": "i:2"}}}}}}, false},
		{"an empty wanted map is satisfied by absence", map[string]any{"spec": map[string]any{"selector": map[string]any{}}}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := contains(tc.want, live); got != tc.ok {
				t.Errorf("contains = %v, want %v", got, tc.ok)
			}
		})
	}
}

func TestServerShape(t *testing.T) {
	want := map[string]any{
		"spec": map[string]any{
			"stdin":    false,
			"path":     "",
			"cpu":      "1000m",
			"replicas": int64(2),
			"ports":    []any{map[string]any{"port": int64(80)}},
			"args":     []any{"a"},
		},
	}
	applied := map[string]any{
		"metadata": map[string]any{"resourceVersion": "7"},
		"spec": map[string]any{
			"path":     "/dev/termination-log",
			"cpu":      "1",
			"replicas": int64(2),
			"ports":    []any{map[string]any{"port": int64(80), "protocol": "TCP"}},
			"args":     []any{"a", "injected"},
			"extra":    "server only",
		},
	}
	got := serverShape(want, applied)
	wantShape := map[string]any{
		"spec": map[string]any{
			"path":     "/dev/termination-log",
			"cpu":      "1",
			"replicas": int64(2),
			"ports":    []any{map[string]any{"port": int64(80)}},
			"args":     []any{"a", "injected"},
		},
	}
	if !reflect.DeepEqual(got, wantShape) {
		t.Errorf("serverShape = %#v\nwant %#v", got, wantShape)
	}
	// The server's form is contained in the live object; an edit of one of
	// its fields still is drift.
	if !contains(got, applied) {
		t.Error("the server's form is not contained in the server's object")
	}
	edited := map[string]any{"spec": map[string]any{"path": "/dev/termination-log", "cpu": "2", "replicas": int64(2),
		"ports": []any{map[string]any{"port": int64(80)}}, "args": []any{"a", "injected"}}}
	if contains(got, edited) {
		t.Error("an edited cpu is not drift against the server's form")
	}
}
