package validation_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/internal/orchestra/validation"
)

// TestSleepRulesOnAPIServer installs the ModelOrchestra and CheckpointPolicy
// CRDs into a real API server (which also checks their CEL rules' cost
// estimates) and checks the sleep, seat and policy rules there and in the
// offline validator: the same resources are accepted and refused, and every
// refusal names the field and says what to do.
func TestSleepRulesOnAPIServer(t *testing.T) {
	cluster := startAPIServer(t)
	res := installCRD(t, cluster, operator.ModelOrchestraCRD(), "modelorchestras")
	policies := installCRD(t, cluster, operator.CheckpointPolicyCRD(), "checkpointpolicies")
	ctx := context.Background()

	const orchestra = `
apiVersion: modelorchestra.io/v1alpha1
kind: ModelOrchestra
metadata: {name: NAME, namespace: default}
spec:
%s`
	simulator := `
      model: {source: "hf://org/repo", file: m.gguf}
      runtime: {engine: simulator, gpu: {count: 1, product: PRODUCT}}`
	dllama := `
      model: {source: "hf://org/repo", file: m.m, tokenizerFile: t.t}
      runtime: {engine: dllama}`
	app := func(name, body, lifecycle string) string {
		return fmt.Sprintf("    %s:%s\n      lifecycle: %s\n", name, body, lifecycle)
	}
	apps := func(a ...string) string { return "  applications:\n" + strings.Join(a, "") }
	sim := func(product string) string { return strings.ReplaceAll(simulator, "PRODUCT", product) }
	seats := "  seatGroups: {g: {}}\n"

	v := newValidator(t)
	for _, tc := range []struct {
		name      string
		spec      string
		wantField string // empty: valid
		wantMsg   string
	}{
		{name: "sleep-before-zero", spec: apps(app("chat", sim("L4"), "{sleepAfter: 2m, zeroAfter: 30m, checkpointPolicy: fast}"))},
		{name: "sleep-only", spec: apps(app("chat", sim("L4"), "{minReplicas: 1, sleepAfter: 1h, sleepLevel: 2, parkAfter: 2h, tiers: {hot: None}, resumeSLO: {resumeNvmeSeconds: 9}}"))},
		{
			name: "sleep-after-zero", spec: apps(app("chat", sim("L4"), "{sleepAfter: 20m, zeroAfter: 15m}")),
			wantField: "spec.applications[chat].lifecycle.sleepAfter", wantMsg: "lifecycle.sleepAfter must be shorter than zeroAfter",
		},
		{
			name: "sleep-at-default-zero", spec: apps(app("chat", sim("L4"), "{sleepAfter: 15m}")),
			wantField: "spec.applications[chat].lifecycle.sleepAfter", wantMsg: "must be shorter than zeroAfter",
		},
		{
			name: "sleep-level-three", spec: apps(app("chat", sim("L4"), "{sleepAfter: 1m, sleepLevel: 3}")),
			wantField: "spec.applications.chat.lifecycle.sleepLevel", wantMsg: "less than or equal to 2",
		},
		{
			name: "dllama-sleeps", spec: apps(app("chat", dllama, "{sleepAfter: 1m}")),
			wantField: "spec.applications[chat].lifecycle.sleepAfter", wantMsg: "distributed-llama cannot sleep (it has no sleep or unload API): remove lifecycle.sleepAfter",
		},
		{
			name: "dllama-policy", spec: apps(app("chat", dllama, "{checkpointPolicy: fast}")),
			wantField: "spec.applications[chat].lifecycle.checkpointPolicy", wantMsg: "remove lifecycle.checkpointPolicy",
		},
		{
			name: "dllama-seat", spec: seats + apps(app("chat", dllama, "{seat: {group: g}}")),
			wantField: "spec.applications[chat].lifecycle.seat", wantMsg: "distributed-llama cannot share an accelerator seat",
		},
		{name: "dllama-scales-to-zero", spec: apps(app("chat", dllama, "{zeroAfter: 5m}"))},
		{
			name: "min-above-max", spec: apps(app("chat", sim("L4"), "{minReplicas: 3, maxReplicas: 2}")),
			wantField: "spec.applications[chat].lifecycle.minReplicas", wantMsg: "lifecycle.minReplicas must not exceed lifecycle.maxReplicas",
		},
		{name: "min-equals-max", spec: apps(app("chat", sim("L4"), "{minReplicas: 2, maxReplicas: 2}"))},
		{
			name: "max-wait-over-ten-minutes", spec: apps(app("chat", sim("L4"), "{maxWait: 11m}")),
			wantField: "spec.applications[chat].lifecycle.maxWait", wantMsg: "lifecycle.maxWait must be between 1s and 10m",
		},
		{name: "max-wait-ten-minutes", spec: apps(app("chat", sim("L4"), "{maxWait: 10m}"))},
		{
			name: "zero-after-under-a-second", spec: apps(app("chat", sim("L4"), "{zeroAfter: 500ms}")),
			wantField: "spec.applications[chat].lifecycle.zeroAfter", wantMsg: "lifecycle.zeroAfter must be at least 1s",
		},
		{name: "zero-after-one-second", spec: apps(app("chat", sim("L4"), "{zeroAfter: 1s}"))},
		{
			name: "keda-one-replica", spec: apps(app("chat", sim("L4"), "{scaler: KEDA, maxReplicas: 1}")),
			wantField: "spec.applications[chat].lifecycle.scaler", wantMsg: "lifecycle.scaler KEDA scales from 1 to maxReplicas: set maxReplicas above 1",
		},
		{name: "keda-two-replicas", spec: apps(app("chat", sim("L4"), "{scaler: KEDA, maxReplicas: 2}"))},
		{
			name:      "rwop-many-replicas",
			spec:      apps("    chat:\n      model: {source: \"hf://org/repo\", file: m.gguf, cache: {accessMode: ReadWriteOncePod}}\n      lifecycle: {maxReplicas: 2}\n"),
			wantField: "spec.applications[chat].lifecycle.maxReplicas", wantMsg: "ReadWriteOncePod claim admits one pod",
		},
		{name: "rwop-one-replica", spec: apps("    chat:\n      model: {source: \"hf://org/repo\", file: m.gguf, cache: {accessMode: ReadWriteOncePod}}\n      lifecycle: {maxReplicas: 1}\n")},
		{
			name: "seat-without-group", spec: apps(app("chat", sim("L4"), "{seat: {group: g}}")),
			wantField: "spec", wantMsg: "lifecycle.seat.group must name a group in spec.seatGroups",
		},
		{
			name: "seat-group-one-product",
			spec: seats + apps(app("a", sim("L4"), "{seat: {group: g, priority: 5}}"), app("b", sim("L4"), "{seat: {group: g, minResidency: 1m}}"), app("c", sim("A100"), "{}")),
		},
		{
			name: "seat-group-two-products", spec: seats + apps(app("a", sim("L4"), "{seat: {group: g}}"), app("b", sim("A100"), "{seat: {group: g}}")),
			wantField: "spec.seatGroups", wantMsg: "they must ask for the same runtime.gpu.count and runtime.gpu.product",
		},
		{
			name: "seat-many-replicas", spec: seats + apps(app("a", sim("L4"), "{seat: {group: g}, maxReplicas: 2}")),
			wantField: "spec.applications[a].lifecycle.maxReplicas", wantMsg: "lifecycle.maxReplicas must be 1 for an application with lifecycle.seat",
		},
		{name: "seat-group-two-replicas", spec: "  seatGroups: {g: {replicas: 2}}\n" + apps(app("a", sim("L4"), "{seat: {group: g}}"), app("b", sim("L4"), "{seat: {group: g}}"))},
		{
			name: "seat-group-replicas-bound", spec: "  seatGroups: {g: {replicas: 9}}\n" + apps(app("a", sim("L4"), "{seat: {group: g}}")),
			wantField: "spec.seatGroups.g.replicas", wantMsg: "less than or equal to 8",
		},
		{
			name:      "seat-group-replicas-rwop",
			spec:      "  seatGroups: {g: {replicas: 2}}\n" + apps("    a:\n      model: {source: \"hf://org/repo\", file: m.gguf, cache: {accessMode: ReadWriteOncePod}}\n      runtime: {engine: simulator}\n      lifecycle: {seat: {group: g}}\n"),
			wantField: "spec.seatGroups", wantMsg: "seatGroups.<group>.replicas above 1 runs every application of the group in several pods",
		},
		{name: "seat-device-memory", spec: "  seatGroups: {g: {deviceMemory: 80Gi}}\n" + apps(app("a", sim("L4"), "{seat: {group: g}}"))},
		{
			name: "seat-priority-bound", spec: seats + apps(app("a", sim("L4"), "{seat: {group: g, priority: 5000}}")),
			wantField: "spec.applications.a.lifecycle.seat.priority", wantMsg: "less than or equal to 1000",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := object(t, fmt.Sprintf(strings.Replace(orchestra, "NAME", tc.name, 1), tc.spec))
			_, offErr := v.Validate(ctx, obj)
			_, srvErr := res.Create(ctx, obj, metav1.CreateOptions{})
			checkRefusal(t, tc.wantField, tc.wantMsg, offErr, srvErr)
		})
	}

	pv, err := validation.New(operator.CheckpointPolicyCRD(), "v1alpha1")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, spec         string
		wantField, wantMsg string
	}{
		{name: "policy-full", spec: "{triggers: {idleSeconds: 300, parkSeconds: 3600, intervalSeconds: 900, preemption: false}, tiers: {hot: RAM, warm: None, cold: S3}, slo: {resumeRamSeconds: 2, resumeNvmeSeconds: 10}}"},
		{name: "policy-empty", spec: "{}"},
		{name: "policy-idle-zero", spec: "{triggers: {idleSeconds: 0}}", wantField: "spec.triggers.idleSeconds", wantMsg: "greater than or equal to 1"},
		{name: "policy-verify-often", spec: "{triggers: {intervalSeconds: 30}}", wantField: "spec.triggers.intervalSeconds", wantMsg: "greater than or equal to 60"},
		{name: "policy-park-month", spec: "{triggers: {parkSeconds: 2592001}}", wantField: "spec.triggers.parkSeconds", wantMsg: "less than or equal to 2592000"},
		{name: "policy-hot-gpu", spec: "{tiers: {hot: GPU}}", wantField: "spec.tiers.hot", wantMsg: `supported values: "RAM", "None"`},
		{name: "policy-slo-zero", spec: "{slo: {resumeRamSeconds: 0}}", wantField: "spec.slo.resumeRamSeconds", wantMsg: "greater than or equal to 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := object(t, fmt.Sprintf("apiVersion: modelorchestra.io/v1alpha1\nkind: CheckpointPolicy\nmetadata: {name: %s, namespace: default}\nspec: %s\n", tc.name, tc.spec))
			_, offErr := pv.Validate(ctx, obj)
			_, srvErr := policies.Create(ctx, obj, metav1.CreateOptions{})
			checkRefusal(t, tc.wantField, tc.wantMsg, offErr, srvErr)
		})
	}
}

// checkRefusal checks that the offline validator and the API server both
// accept (wantField empty) or both refuse, naming wantField with wantMsg.
func checkRefusal(t *testing.T, wantField, wantMsg string, offErr, srvErr error) {
	t.Helper()
	if wantField == "" {
		if offErr != nil || srvErr != nil {
			t.Fatalf("valid resource refused: offline %v, API server %v", offErr, srvErr)
		}
		return
	}
	if offErr == nil || srvErr == nil {
		t.Fatalf("invalid resource accepted: offline %v, API server %v", offErr, srvErr)
	}
	if !apierrors.IsInvalid(srvErr) {
		t.Errorf("API server error is not Invalid: %v", srvErr)
	}
	for _, err := range []error{offErr, srvErr} {
		if !strings.Contains(err.Error(), wantField+":") || !strings.Contains(err.Error(), wantMsg) {
			t.Errorf("error does not name %s with %q: %v", wantField, wantMsg, err)
		}
	}
}
