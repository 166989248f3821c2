package preview

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/model-orchestra/operator/internal/dispatch"
	"github.com/model-orchestra/operator/internal/gateway"
)

// TestRolloutsCutNothing checks what makes a rolling restart of the data
// plane cut nothing, on what the chart renders with 2 gateways, 2
// dispatchers and 3 NATS servers: every part rolls one pod at a time with
// the new one ready first (gateway, dispatcher) or one unavailable at most
// (NATS), each has a PodDisruptionBudget, and each pod's grace period
// covers its drain (gateway: drainDelay + drainTimeout; dispatcher:
// shutdownTimeout; NATS: the lame duck duration).
func TestRolloutsCutNothing(t *testing.T) {
	p := newRenderer(t)
	objs, err := decode(strings.NewReader(minimal))
	if err != nil {
		t.Fatal(err)
	}
	res, _, err := p.Render(context.Background(), objs[0], Options{Set: []string{
		"spec.gateway.replicas=2", "spec.dispatcher.replicas=2", "spec.nats.replicas=3",
	}})
	if err != nil {
		t.Fatal(err)
	}
	byKind := map[string]*unstructured.Unstructured{}
	for _, o := range res.Objects {
		byKind[o.GetKind()+"/"+o.GetName()] = o
	}
	grace := func(o *unstructured.Unstructured) time.Duration {
		v, _, _ := unstructured.NestedFieldNoCopy(o.Object, "spec", "template", "spec", "terminationGracePeriodSeconds")
		return time.Duration(number(v)) * time.Second
	}
	for _, part := range []string{"t-gateway", "t-dispatcher"} {
		d := byKind["Deployment/"+part]
		if d == nil {
			t.Fatalf("no Deployment %s", part)
		}
		ru, _, _ := unstructured.NestedMap(d.Object, "spec", "strategy", "rollingUpdate")
		if number(ru["maxUnavailable"]) != 0 || number(ru["maxSurge"]) != 1 {
			t.Errorf("%s rolls with %v; want maxUnavailable 0, maxSurge 1", part, ru)
		}
		if byKind["PodDisruptionBudget/"+part] == nil {
			t.Errorf("%s with 2 replicas has no PodDisruptionBudget", part)
		}
	}
	gcm := byKind["ConfigMap/t-gateway"]
	raw, _, _ := unstructured.NestedString(gcm.Object, "data", "gateway.yaml")
	gcfg, err := gateway.ParseConfig([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	if drain, g := gcfg.Server.DrainDelay.Duration+gcfg.Server.DrainTimeout.Duration, grace(byKind["Deployment/t-gateway"]); drain >= g {
		t.Errorf("the gateway drains for %v but its grace period is %v", drain, g)
	}
	dcm := byKind["ConfigMap/t-dispatcher"]
	raw, _, _ = unstructured.NestedString(dcm.Object, "data", "dispatcher.yaml")
	dcfg := dispatch.Default()
	if err := yaml.Unmarshal([]byte(raw), &dcfg); err != nil {
		t.Fatal(err)
	}
	if st, g := dcfg.ShutdownTimeout.Duration, grace(byKind["Deployment/t-dispatcher"]); st >= g || st < time.Minute {
		t.Errorf("the dispatcher finishes its requests for %v with a grace period of %v; want at least a minute, within the grace period", st, g)
	}
	nats := byKind["StatefulSet/t-nats"]
	if nats == nil {
		t.Fatal("no NATS StatefulSet")
	}
	if byKind["PodDisruptionBudget/t-nats"] == nil {
		t.Error("NATS with 3 replicas has no PodDisruptionBudget")
	}
	ncm := byKind["ConfigMap/t-nats"]
	conf, _, _ := unstructured.NestedStringMap(ncm.Object, "data")
	var ldm time.Duration
	for _, v := range conf {
		for line := range strings.Lines(v) {
			f := strings.Fields(strings.ReplaceAll(line, ":", " "))
			if len(f) == 2 && (f[0] == "lame_duck_duration" || f[0] == "lame_duck_grace_period") {
				d, err := time.ParseDuration(f[1])
				if err != nil {
					t.Fatalf("%s: %v", line, err)
				}
				ldm += d
			}
		}
	}
	if g := grace(nats); ldm == 0 || ldm >= g {
		t.Errorf("NATS's lame duck mode takes %v with a grace period of %v", ldm, g)
	}
}

// number is a decoded JSON number, or -1.
func number(v any) float64 {
	switch n := v.(type) {
	case int64:
		return float64(n)
	case float64:
		return n
	case int:
		return float64(n)
	}
	return -1
}
