package orchestra

import (
	"context"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	operator "github.com/model-orchestra/operator"
	"github.com/model-orchestra/operator/internal/plugin"
)

func mountsConfig(name string) corev1.PodTemplateSpec {
	p := pod(corev1.Container{Name: "c"})
	p.Spec.Volumes = []corev1.Volume{{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: name}}}}}
	return p
}

func usesSecret(name string) corev1.PodTemplateSpec {
	return pod(corev1.Container{Name: "c", Env: []corev1.EnvVar{{Name: "TOKEN", ValueFrom: &corev1.EnvVarSource{
		SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "token"},
	}}}})
}

// checksum runs config-checksum over objs and returns the annotation of
// the object named target ("" when absent).
func checksum(t *testing.T, reader client.Reader, target string, objs ...*unstructuredT) string {
	t.Helper()
	pr, err := NewConfigChecksum(nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pr.PostRender(context.Background(), plugin.RenderContext{Reader: reader}, objs)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range out {
		if o.GetName() == target {
			if o.GetKind() == "ConfigMap" {
				t.Fatalf("target %s is a ConfigMap", target)
			}
			return template(t, o).Annotations[DefaultChecksumAnnotation]
		}
	}
	t.Fatalf("no object %s", target)
	return ""
}

func TestConfigChecksum(t *testing.T) {
	secret := func(token string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf", Namespace: "ns"}, Data: map[string][]byte{"token": []byte(token)}}
	}
	cases := []struct {
		name string
		// a and b are two renders; same says whether the checksums must be equal.
		a, b func(t *testing.T) string
		same bool
	}{
		{
			name: "a changed rendered ConfigMap rolls the pods",
			a: func(t *testing.T) string {
				return checksum(t, nil, "gw", configMap("cfg", map[string]any{"k": "1"}), workload(t, "Deployment", "gw", mountsConfig("cfg")))
			},
			b: func(t *testing.T) string {
				return checksum(t, nil, "gw", configMap("cfg", map[string]any{"k": "2"}), workload(t, "Deployment", "gw", mountsConfig("cfg")))
			},
		},
		{
			name: "a change to a ConfigMap the pod does not use does not roll it",
			a: func(t *testing.T) string {
				return checksum(t, nil, "gw", configMap("cfg", map[string]any{"k": "1"}), configMap("other", map[string]any{"k": "1"}), workload(t, "Deployment", "gw", mountsConfig("cfg")))
			},
			b: func(t *testing.T) string {
				return checksum(t, nil, "gw", configMap("cfg", map[string]any{"k": "1"}), configMap("other", map[string]any{"k": "2"}), workload(t, "Deployment", "gw", mountsConfig("cfg")))
			},
			same: true,
		},
		{
			name: "a changed user Secret rolls the pods when the live Secret is readable",
			a: func(t *testing.T) string {
				return checksum(t, fake.NewClientBuilder().WithObjects(secret("one")).Build(), "engine", workload(t, "StatefulSet", "engine", usesSecret("hf")))
			},
			b: func(t *testing.T) string {
				return checksum(t, fake.NewClientBuilder().WithObjects(secret("two")).Build(), "engine", workload(t, "StatefulSet", "engine", usesSecret("hf")))
			},
		},
		{
			name: "creating a missing Secret rolls the pods",
			a: func(t *testing.T) string {
				return checksum(t, fake.NewClientBuilder().Build(), "engine", workload(t, "StatefulSet", "engine", usesSecret("hf")))
			},
			b: func(t *testing.T) string {
				return checksum(t, fake.NewClientBuilder().WithObjects(secret("one")).Build(), "engine", workload(t, "StatefulSet", "engine", usesSecret("hf")))
			},
		},
		{
			name: "offline the checksum of a user Secret is stable",
			a: func(t *testing.T) string {
				return checksum(t, nil, "engine", workload(t, "StatefulSet", "engine", usesSecret("hf")))
			},
			b: func(t *testing.T) string {
				return checksum(t, nil, "engine", workload(t, "StatefulSet", "engine", usesSecret("hf")))
			},
			same: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tc.a(t), tc.b(t)
			if a == "" || b == "" {
				t.Fatalf("no checksum annotation: %q %q", a, b)
			}
			if (a == b) != tc.same {
				t.Errorf("checksums %s and %s: equal = %v, want %v", a, b, a == b, tc.same)
			}
		})
	}
}

func TestConfigChecksumLeavesOthersAlone(t *testing.T) {
	// Jobs have immutable pod templates; pods without configuration have
	// nothing to roll for.
	if got := checksum(t, nil, "fetch", configMap("cfg", map[string]any{"k": "1"}), workload(t, "Job", "fetch", mountsConfig("cfg"))); got != "" {
		t.Errorf("Job annotated with %s", got)
	}
	if got := checksum(t, nil, "plain", workload(t, "Deployment", "plain", pod(corev1.Container{Name: "c"}))); got != "" {
		t.Errorf("pod without configuration annotated with %s", got)
	}
}

// recordingReader records the objects read through it, once each.
type recordingReader struct {
	client.Reader
	read []plugin.ObjectRef
}

func (r *recordingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	kind := "ConfigMap"
	if _, ok := obj.(*corev1.Secret); ok {
		kind = "Secret"
	}
	ref := plugin.ObjectRef{GVK: corev1.SchemeGroupVersion.WithKind(kind), Namespace: key.Namespace, Name: key.Name}
	if !slices.Contains(r.read, ref) {
		r.read = append(r.read, ref)
	}
	return r.Reader.Get(ctx, key, obj, opts...)
}

func TestConfigChecksumDigestInputs(t *testing.T) {
	secretRef := func(name string) plugin.ObjectRef {
		return plugin.ObjectRef{GVK: corev1.SchemeGroupVersion.WithKind("Secret"), Namespace: "ns", Name: name}
	}
	configMapRef := func(name string) plugin.ObjectRef {
		return plugin.ObjectRef{GVK: corev1.SchemeGroupVersion.WithKind("ConfigMap"), Namespace: "ns", Name: name}
	}
	natsCreds := pod(corev1.Container{Name: "c"})
	natsCreds.Spec.Volumes = []corev1.Volume{{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "nats-creds"}}}}
	cases := []struct {
		name string
		objs func(t *testing.T) []*unstructuredT
		want []plugin.ObjectRef
	}{
		{
			name: "a user Secret in env valueFrom (an API key, an HF token)",
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{workload(t, "StatefulSet", "engine", usesSecret("hf"))}
			},
			want: []plugin.ObjectRef{secretRef("hf")},
		},
		{
			name: "a mounted credentials Secret (NATS credentials)",
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{workload(t, "Deployment", "gateway", natsCreds)}
			},
			want: []plugin.ObjectRef{secretRef("nats-creds")},
		},
		{
			name: "a rendered ConfigMap is not a live input, a user's one is",
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{
					configMap("cfg", map[string]any{"k": "1"}),
					workload(t, "Deployment", "gw", mountsConfig("cfg")),
					workload(t, "Deployment", "other", mountsConfig("users-cfg")),
				}
			},
			want: []plugin.ObjectRef{configMapRef("users-cfg")},
		},
		{
			name: "a Secret two workloads use is named once",
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{workload(t, "StatefulSet", "a", usesSecret("hf")), workload(t, "StatefulSet", "b", usesSecret("hf"))}
			},
			want: []plugin.ObjectRef{secretRef("hf")},
		},
		{
			name: "Jobs are not rolled, so what they use is not read",
			objs: func(t *testing.T) []*unstructuredT {
				return []*unstructuredT{workload(t, "Job", "fetch", usesSecret("hf"))}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := NewConfigChecksum(nil)
			if err != nil {
				t.Fatal(err)
			}
			rc := plugin.RenderContext{Owner: owner(t, "{}")}
			rec := &recordingReader{Reader: fake.NewClientBuilder().Build()}
			rc.Reader = rec
			out, err := pr.PostRender(context.Background(), rc, tc.objs(t))
			if err != nil {
				t.Fatal(err)
			}
			rc.Reader = nil // DigestInputs must not read
			got, err := pr.(plugin.DigestContributor).DigestInputs(context.Background(), rc, out)
			if err != nil {
				t.Fatal(err)
			}
			sortRefs := cmpopts.SortSlices(func(a, b plugin.ObjectRef) bool { return a.GVK.Kind+a.Name < b.GVK.Kind+b.Name })
			if diff := cmp.Diff(tc.want, got, sortRefs, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("DigestInputs (-want +got):\n%s", diff)
			}
			// Exactly what PostRender read live, so that the engine watches
			// every input of the checksum and nothing else.
			if diff := cmp.Diff(rec.read, got, sortRefs, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("DigestInputs differ from what PostRender read (-read +named):\n%s", diff)
			}
		})
	}
}

func TestConfigChecksumDigestInputsDefaultNamespace(t *testing.T) {
	pr, _ := NewConfigChecksum(nil)
	w := workload(t, "Deployment", "gw", usesSecret("key"))
	w.SetNamespace("") // as a chart renders it; the release's namespace applies
	got, err := pr.(plugin.DigestContributor).DigestInputs(context.Background(), plugin.RenderContext{Owner: owner(t, "{}")}, []*unstructuredT{w})
	if err != nil {
		t.Fatal(err)
	}
	want := []plugin.ObjectRef{{GVK: corev1.SchemeGroupVersion.WithKind("Secret"), Namespace: "ns", Name: "key"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("DigestInputs (-want +got):\n%s", diff)
	}
}

// TestConfigChecksumRunsLast: the embedded watches.yaml lists config-checksum
// after every other post-renderer, so that the checksum covers the
// ConfigMaps and Secrets as they are applied.
func TestConfigChecksumRunsLast(t *testing.T) {
	var entries []struct {
		PostRenderers []struct{ Name string } `json:"postRenderers"`
	}
	if err := yaml.Unmarshal(operator.Watches(), &entries); err != nil {
		t.Fatal(err)
	}
	for i, e := range entries {
		for j, pr := range e.PostRenderers {
			if pr.Name == ConfigChecksumName && j != len(e.PostRenderers)-1 {
				t.Errorf("watches.yaml entry %d runs %s at position %d of %d: it must run last", i, ConfigChecksumName, j+1, len(e.PostRenderers))
			}
		}
	}
}
