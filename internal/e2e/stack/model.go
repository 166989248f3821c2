// Package stack drives a Model Orchestra stack on a real cluster, the way a
// user would: it installs the operator from its install chart, seeds a model
// cache through the local Hugging Face mirror, applies a ModelOrchestra,
// waits for it to be Ready (explaining why when it is not), and talks to the
// gateway's OpenAI API. The `make run` demo (hack/demo) and the end-to-end
// tests (internal/e2e) share it, so the demo shows exactly what the tests
// check.
package stack

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Demo model repository served by the mirror: hf://DemoOrg/DemoRepo.
const (
	DemoOrg   = "demo"
	DemoRepo  = "tiny-gguf"
	DemoModel = DemoOrg + "/" + DemoRepo
	// DemoFile is the GGUF file the engine is told to load.
	DemoFile = "tiny-demo.gguf"
	// NodeAddress is the real node's address in the local cluster: pods
	// reach host processes listening on it (docs/localcluster.md).
	NodeAddress = "10.123.0.1"
)

// TinyModelFiles returns the files of the demo repository, by path: a
// GGUF file with a valid header and metadata but no tensors (the simulator
// reads only metadata, and orchestra-fetch --format=gguf checks the magic
// and version), a config.json and a README.
func TinyModelFiles() map[string][]byte {
	return map[string][]byte{
		DemoFile: tinyGGUF(map[string]any{
			"general.architecture":   "llama",
			"general.name":           "orchestra-demo-tiny",
			"llama.context_length":   uint32(2048),
			"llama.embedding_length": uint32(64),
			"llama.block_count":      uint32(2),
		}),
		"config.json": []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","max_position_embeddings":2048,"hidden_size":64,"num_hidden_layers":2}` + "\n"),
		"README.md":   []byte("# tiny-gguf\n\nA metadata-only GGUF model for the Model Orchestra demo and end-to-end tests.\n"),
	}
}

// WriteTinyModel writes the demo repository under root as
// <root>/<org>/<repo>/..., the layout hack/hubmirror serves.
func WriteTinyModel(root string) error {
	dir := filepath.Join(root, DemoOrg, DemoRepo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, data := range TinyModelFiles() {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("writing demo model file %s: %w", name, err)
		}
	}
	return nil
}

// tinyGGUF encodes a GGUF v3 file with the given metadata (uint32 and
// string values) and no tensors.
func tinyGGUF(meta map[string]any) []byte {
	const (
		typeUint32 = 4
		typeString = 8
	)
	var b bytes.Buffer
	le := func(v any) { _ = binary.Write(&b, binary.LittleEndian, v) }
	str := func(s string) { le(uint64(len(s))); b.WriteString(s) }
	b.WriteString("GGUF")
	le(uint32(3))         // version
	le(uint64(0))         // tensors
	le(uint64(len(meta))) // metadata key/value pairs
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		str(k)
		switch v := meta[k].(type) {
		case uint32:
			le(uint32(typeUint32))
			le(v)
		case string:
			le(uint32(typeString))
			str(v)
		default:
			panic(fmt.Sprintf("gguf metadata %s: unsupported type %T", k, v))
		}
	}
	// Pad to the default alignment, as writers do before tensor data.
	for b.Len()%32 != 0 {
		b.WriteByte(0)
	}
	return b.Bytes()
}

// SeedOptions describe a model cache filled by orchestra-fetch from a hub.
type SeedOptions struct {
	Namespace string
	// Claim is the PersistentVolumeClaim to create (if missing) and fill.
	Claim string
	Size  string // default 1Gi
	// Source is the hf:// source, e.g. "hf://demo/tiny-gguf".
	Source string
	// HubEndpoint is the hub the fetcher talks to (the mirror).
	HubEndpoint string
	Format      string
	// FetchImage is the orchestra-fetch image.
	FetchImage string
	Timeout    time.Duration // default 5m
}

// SeedCache creates the claim and runs orchestra-fetch in a Job to fill it
// from the hub, waiting for the Job to succeed. It is idempotent: a Job
// that already succeeded is kept, a failed one is replaced.
//
// The operator's own fetch Job, pointed at the same claim (cache
// existingClaim) with the same source, then finds a complete cache and ends
// without contacting the hub. This is how the demo and the tests use the
// local mirror while the API has no field for the hub endpoint.
func SeedCache(ctx context.Context, cs kubernetes.Interface, o SeedOptions, logf func(string, ...any)) error {
	if o.Size == "" {
		o.Size = "1Gi"
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Minute
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: o.Claim, Namespace: o.Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "model-orchestra-demo"}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(o.Size)}},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims(o.Namespace).Create(ctx, pvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating model cache claim %s/%s: %w", o.Namespace, o.Claim, err)
	}
	name := o.Claim + "-seed"
	jobs := cs.BatchV1().Jobs(o.Namespace)
	if old, err := jobs.Get(ctx, name, metav1.GetOptions{}); err == nil {
		if jobSucceeded(old) {
			logf("model cache %s already seeded from %s", o.Claim, o.Source)
			return nil
		}
		if err := deleteAndWait(ctx, cs, o.Namespace, name); err != nil {
			return err
		}
	} else if !apierrors.IsNotFound(err) {
		return fmt.Errorf("reading seed job %s: %w", name, err)
	}
	args := []string{
		"--source=" + o.Source,
		"--hf-endpoint=" + o.HubEndpoint,
		"--dest=/models",
		"--progress-bar=never",
		"--log-format=json",
		"--max-attempts=3",
	}
	if o.Format != "" {
		args = append(args, "--format="+o.Format)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.Namespace, Labels: map[string]string{"app.kubernetes.io/part-of": "model-orchestra-demo"}},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](2),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"job-name": name}},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](65532),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "fetch",
						Image:           o.FetchImage,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Args:            args,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "model", MountPath: "/models"}, {Name: "tmp", MountPath: "/tmp"}},
					}},
					Volumes: []corev1.Volume{
						{Name: "model", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: o.Claim}}},
						{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
					},
				},
			},
		},
	}
	if _, err := jobs.Create(ctx, job, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating seed job %s: %w", name, err)
	}
	logf("seeding model cache %s: orchestra-fetch %s from %s", o.Claim, o.Source, o.HubEndpoint)
	var last *batchv1.Job
	err := wait.PollUntilContextTimeout(ctx, time.Second, o.Timeout, true, func(ctx context.Context) (bool, error) {
		j, err := jobs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil //nolint:nilerr // transient; the timeout reports it
		}
		last = j
		if jobFailed(j) {
			return false, fmt.Errorf("seed job %s failed", name)
		}
		return jobSucceeded(j), nil
	})
	if err != nil {
		diag := DiagnosePods(context.WithoutCancel(ctx), cs, o.Namespace, "job-name="+name, 20)
		if last != nil {
			diag = fmt.Sprintf("job %s: active %d, failed %d, succeeded %d\n%s", name, last.Status.Active, last.Status.Failed, last.Status.Succeeded, diag)
		}
		return fmt.Errorf("seeding model cache %s from %s: %w\n%s", o.Claim, o.Source, err, diag)
	}
	logf("model cache %s seeded", o.Claim)
	return nil
}

func jobSucceeded(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func jobFailed(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

func deleteAndWait(ctx context.Context, cs kubernetes.Interface, ns, name string) error {
	jobs := cs.BatchV1().Jobs(ns)
	err := jobs.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting job %s: %w", name, err)
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := jobs.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
