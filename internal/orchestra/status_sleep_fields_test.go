package orchestra

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/model-orchestra/operator/api/v1alpha1"
)

// Checkpoint fields that are accepted but not acted on are never silently
// ignored: CheckpointFieldsSupported is False naming each application and
// field, and turns True once none is set.
func TestCheckpointFieldsSupportedCondition(t *testing.T) {
	app := func(lifecycle string) string {
		return `{applications: {chat: {model: {source: "hf://org/chat", file: m.gguf}, runtime: {engine: simulator}, lifecycle: ` + lifecycle + `}}}`
	}
	seat := func(lifecycle string) string {
		return `{seatGroups: {g: {}}, applications: {chat: {model: {source: "hf://org/chat", file: m.gguf}, runtime: {engine: simulator}, lifecycle: ` + lifecycle + `}}}`
	}
	s3app := func(model, args string) string {
		return `{applications: {chat: {model: ` + model + `, runtime: {engine: simulator, args: [` + args + `]}, lifecycle: {sleepAfter: 2m, zeroAfter: 30m, tiers: {cold: S3}}}}}`
	}
	const s3model = `{source: "s3://models/llama", credentialsSecretRef: {name: s3-keys}, s3: {endpoint: "http://minio:9000"}}`
	policy := func(spec string) PolicyDocuments {
		return PolicyDocuments{types.NamespacedName{Namespace: "ns", Name: "fast"}: policyDoc(t, "fast", spec)}
	}
	for _, tc := range []struct {
		name     string
		spec     string
		policies PolicyDocuments
		old      []metav1.Condition
		// secrets, when not nil, are the cluster's Secrets (data by name)
		// that the credentials check reads.
		secrets map[string]map[string][]byte
		status  string // "" means absent
		msg     []string
	}{
		{name: "defaults: nothing to say", spec: app(`{sleepAfter: 2m, zeroAfter: 30m}`), policies: PolicyDocuments{}},
		{
			name: "hot None with level 1 is refused", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, tiers: {hot: None}}`), policies: PolicyDocuments{},
			status: "False", msg: []string{"chat: tiers.hot is None", "sleepLevel 2"},
		},
		{
			name: "hot None with level 2 is honored", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, sleepLevel: 2, tiers: {hot: None}}`), policies: PolicyDocuments{},
		},
		{
			name: "warm None with parkAfter is honored", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, parkAfter: 5m, tiers: {warm: None}}`), policies: PolicyDocuments{},
		},
		{
			name: "warm None without parkAfter is honored", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, tiers: {warm: None}}`), policies: PolicyDocuments{},
		},
		{
			name: "cold S3 from the policy, an hf:// model", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, checkpointPolicy: fast}`), policies: policy(`{tiers: {cold: S3}}`),
			status: "False", msg: []string{`chat: tiers.cold is S3, but model.source "hf://org/chat" is not an s3:// source`, "use tiers.cold ModelCache"},
		},
		{
			name: "cold S3 of an s3:// model the simulator loads is acted on", spec: s3app(s3model, `"--weights-file=/models/w.bin"`), policies: PolicyDocuments{},
			secrets: map[string]map[string][]byte{"s3-keys": {"AWS_ACCESS_KEY_ID": []byte("AK"), "AWS_SECRET_ACCESS_KEY": []byte("SK")}},
		},
		{
			name: "cold S3 whose credentials Secret does not exist", spec: s3app(s3model, `"--weights-file=/models/w.bin"`), policies: PolicyDocuments{},
			secrets: map[string]map[string][]byte{},
			status:  "False", msg: []string{"chat: tiers.cold is S3, but Secret ns/s3-keys (model.credentialsSecretRef) does not exist"},
		},
		{
			name: "cold S3 whose credentials Secret lacks a key", spec: s3app(s3model, `"--weights-file=/models/w.bin"`), policies: PolicyDocuments{},
			secrets: map[string]map[string][]byte{"s3-keys": {"AWS_ACCESS_KEY_ID": []byte("AK")}},
			status:  "False", msg: []string{"chat: tiers.cold is S3, but Secret ns/s3-keys (model.credentialsSecretRef) has no AWS_SECRET_ACCESS_KEY"},
		},
		{
			name: "cold S3 with synthetic weights", spec: s3app(s3model, `"--weights-bytes=1GiB"`), policies: PolicyDocuments{},
			status: "False", msg: []string{"chat: tiers.cold is S3, but runtime.args have no --weights-file=/models/<file>"},
		},
		{
			name: "cold S3 without a credentials Secret", spec: s3app(`{source: "s3://models/llama"}`, `"--weights-file=/models/w.bin"`), policies: PolicyDocuments{},
			status: "False", msg: []string{"chat: tiers.cold is S3, but model.credentialsSecretRef is not set"},
		},
		{
			name: "preemption true in the policy", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, checkpointPolicy: fast}`), policies: policy(`{triggers: {preemption: true}, tiers: {hot: None}}`),
			status: "False", msg: []string{"triggers.preemption of CheckpointPolicy fast has no effect", "tiers.hot is None"},
		},
		{
			name: "preemption false is what happens anyway", spec: app(`{sleepAfter: 2m, zeroAfter: 30m, checkpointPolicy: fast}`), policies: policy(`{triggers: {preemption: false, intervalSeconds: 60}}`),
		},
		{
			name: "preemption false in a seat group is not honored", spec: seat(`{seat: {group: g}, checkpointPolicy: fast}`), policies: policy(`{triggers: {preemption: false}}`),
			status: "False", msg: []string{"chat: triggers.preemption false of CheckpointPolicy fast is not honored"},
		},
		{
			name: "preemption true in a seat group is what happens", spec: seat(`{seat: {group: g}, checkpointPolicy: fast}`), policies: policy(`{triggers: {preemption: true}}`),
		},
		{
			name: "an application that does not sleep is not judged", spec: app(`{zeroAfter: 30m, tiers: {cold: S3}}`), policies: PolicyDocuments{},
		},
		{
			name: "cleared once fixed", spec: app(`{sleepAfter: 2m, zeroAfter: 30m}`), policies: PolicyDocuments{},
			old:    []metav1.Condition{{Type: v1alpha1.ConditionCheckpointFieldsSupported, Status: metav1.ConditionFalse}},
			status: "True", msg: []string{"every checkpoint field"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mo, err := Decode(owner(t, tc.spec))
			if err != nil {
				t.Fatal(err)
			}
			pols := resolvePolicies(context.Background(), tc.policies, mo)
			var secrets map[string]string
			if tc.secrets != nil {
				b := fake.NewClientBuilder()
				for name, data := range tc.secrets {
					b = b.WithObjects(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: mo.Namespace, Name: name}, Data: data})
				}
				secrets = coldS3SecretProblems(context.Background(), b.Build(), mo, pols)
			}
			conds := sleepConditions(mo, nil, pols, secrets, tc.old)
			c := meta.FindStatusCondition(conds, v1alpha1.ConditionCheckpointFieldsSupported)
			switch {
			case tc.status == "" && c != nil:
				t.Fatalf("condition set (%s %s: %s), want it absent", c.Status, c.Reason, c.Message)
			case tc.status == "":
				return
			case c == nil:
				t.Fatalf("condition absent, want %s", tc.status)
			case string(c.Status) != tc.status:
				t.Fatalf("condition %s (%s), want %s", c.Status, c.Message, tc.status)
			}
			if c.Status == metav1.ConditionFalse && c.Reason != v1alpha1.ReasonCheckpointUnsupported {
				t.Errorf("reason %s, want %s", c.Reason, v1alpha1.ReasonCheckpointUnsupported)
			}
			for _, m := range tc.msg {
				if !strings.Contains(c.Message, m) {
					t.Errorf("message %q does not contain %q", c.Message, m)
				}
			}
		})
	}
}
