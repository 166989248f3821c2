package validation_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/model-orchestra/operator/api/v1alpha1"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
)

// specWith is a valid defaulted spec with one hf:// application, changed
// by fn.
func specWith(fn func(s *v1alpha1.ModelOrchestraSpec)) *v1alpha1.ModelOrchestraSpec {
	s := &v1alpha1.ModelOrchestraSpec{
		NATS: v1alpha1.NATSSpec{Replicas: 1, Storage: &v1alpha1.VolumeSpec{Size: resource.MustParse("10Gi")}},
		Applications: map[string]v1alpha1.Application{
			"chat": {Model: v1alpha1.ModelSpec{Source: "hf://org/repo", File: "m.gguf"}},
		},
	}
	if fn != nil {
		fn(s)
	}
	return s
}

func model(fn func(m *v1alpha1.ModelSpec)) func(s *v1alpha1.ModelOrchestraSpec) {
	return func(s *v1alpha1.ModelOrchestraSpec) {
		app := s.Applications["chat"]
		fn(&app.Model)
		s.Applications["chat"] = app
	}
}

func natsSize(q string) func(s *v1alpha1.ModelOrchestraSpec) {
	return func(s *v1alpha1.ModelOrchestraSpec) { s.NATS.Storage.Size = resource.MustParse(q) }
}

// seated puts the named applications into seat group g, each with the
// given node selector (nil: none), adding the applications it lacks.
func seated(selectors map[string]map[string]string) func(s *v1alpha1.ModelOrchestraSpec) {
	return func(s *v1alpha1.ModelOrchestraSpec) {
		s.SeatGroups = map[string]v1alpha1.SeatGroupSpec{"g": {ActiveSeats: 1}}
		for name, sel := range selectors {
			app := s.Applications["chat"]
			app.Runtime.NodeSelector = sel
			app.Lifecycle = &v1alpha1.LifecycleSpec{Seat: &v1alpha1.SeatSpec{Group: "g"}}
			s.Applications[name] = app
		}
	}
}

func TestSpec(t *testing.T) {
	for _, tc := range []struct {
		name string
		fn   func(s *v1alpha1.ModelOrchestraSpec)
		want []string // substrings of the error; none: valid
	}{
		{name: "defaults"},
		{name: "nats storage at the minimum", fn: natsSize("2Gi")},
		{name: "nats storage in decimal units above the minimum", fn: natsSize("3G")},
		{name: "nats storage of 1Gi", fn: natsSize("1Gi"), want: []string{"spec.nats.storage.size", `"1Gi"`, "at least 2Gi"}},
		{name: "nats storage just under 2Gi", fn: natsSize("2G"), want: []string{"spec.nats.storage.size", "at least 2Gi"}},
		{name: "external nats has no storage", fn: func(s *v1alpha1.ModelOrchestraSpec) { s.NATS.URL, s.NATS.Storage = "nats://n:4222", nil }},
		{name: "hub endpoint with hf source", fn: model(func(m *v1alpha1.ModelSpec) { m.HubEndpoint = "http://10.123.0.1:8088" })},
		{name: "hub endpoint with a path", fn: model(func(m *v1alpha1.ModelSpec) { m.HubEndpoint = "https://mirror.example.com/hf/" })},
		{
			name: "hub endpoint with an s3 source",
			fn:   model(func(m *v1alpha1.ModelSpec) { m.Source, m.HubEndpoint = "s3://bucket/m", "http://mirror:8080" }),
			want: []string{"spec.applications[chat].model.hubEndpoint", "only used with hf:// sources"},
		},
		{
			name: "hub endpoint without a host",
			fn:   model(func(m *v1alpha1.ModelSpec) { m.HubEndpoint = "http:///path" }),
			want: []string{"spec.applications[chat].model.hubEndpoint", "must name a host"},
		},
		{
			name: "hub endpoint with credentials",
			fn:   model(func(m *v1alpha1.ModelSpec) { m.HubEndpoint = "https://user:pw@mirror" }),
			want: []string{"spec.applications[chat].model.hubEndpoint", "credentials"},
		},
		{
			name: "seat group with agreeing node selectors",
			fn: seated(map[string]map[string]string{
				"a": {"pool": "gpu", "zone": "z1"},
				"b": {"pool": "gpu"},
				"c": nil,
			}),
		},
		{
			name: "seat group with conflicting node selectors",
			fn: seated(map[string]map[string]string{
				"a": {"pool": "gpu", "zone": "z1"},
				"b": {"zone": "z2"},
			}),
			want: []string{"spec.applications[b].runtime.nodeSelector[zone]", `"z2"`, `seat group "g"`, `application "a" selects zone=z1`},
		},
		{
			name: "different seat groups may select different nodes",
			fn: func(s *v1alpha1.ModelOrchestraSpec) {
				seated(map[string]map[string]string{"a": {"zone": "z1"}, "b": {"zone": "z2"}})(s)
				s.SeatGroups["h"] = v1alpha1.SeatGroupSpec{ActiveSeats: 1}
				s.Applications["b"].Lifecycle.Seat.Group = "h"
			},
		},
		{
			name: "hub endpoint that is not http",
			fn:   model(func(m *v1alpha1.ModelSpec) { m.HubEndpoint = "mirror:8080" }),
			want: []string{"spec.applications[chat].model.hubEndpoint", "absolute http:// or https:// URL"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := validation.Spec(specWith(tc.fn))
			if len(tc.want) == 0 {
				if len(errs) > 0 {
					t.Fatalf("valid spec refused: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) == 0 {
				t.Fatalf("invalid spec accepted; want an error with %q", tc.want)
			}
			msg := errs.ToAggregate().Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}
}
