package helmreconciler_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/model-orchestra/operator/internal/plugin"
)

// greetingStatus is a test status plugin. The whole of a plugin is a type
// like this one plus one registration line (see registry):
//
//	reg.RegisterStatus("greeting-status", greetingStatus{})
type greetingStatus struct{}

func (greetingStatus) Status(_ context.Context, in plugin.StatusInput) (plugin.StatusResult, error) {
	res := plugin.StatusResult{Fields: map[string]any{"objects": int64(len(in.Objects))}}
	for _, o := range in.Objects {
		if o.GetKind() == "ConfigMap" {
			g, _, _ := unstructured.NestedString(o.Object, "data", "greeting")
			res.Fields["greeting"] = g
		}
	}
	res.Conditions = []metav1.Condition{{Type: "GreetingPublished", Status: metav1.ConditionTrue, Reason: "ConfigMapExists", Message: "the greeting is published"}}
	return res, nil
}

// secretStamp is a test post-renderer that reads a live object: it stamps
// the pod template of every Deployment with a digest of the data of the
// Secret "<resource>-token" (absent: "absent"), as config-checksum does for
// the Secrets a pod references, and names that Secret as a live input.
type secretStamp struct{}

const stampAnnotation = "test.modelorchestra.io/token-digest"

func (secretStamp) PostRender(ctx context.Context, rc plugin.RenderContext, objs []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	stamp := "offline"
	if rc.Reader != nil {
		s := &corev1.Secret{}
		err := rc.Reader.Get(ctx, types.NamespacedName{Namespace: rc.Owner.GetNamespace(), Name: rc.Owner.GetName() + "-token"}, s)
		switch {
		case apierrors.IsNotFound(err):
			stamp = "absent"
		case err != nil:
			return nil, err
		default:
			b, _ := json.Marshal(s.Data)
			sum := sha256.Sum256(b)
			stamp = hex.EncodeToString(sum[:])
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			if err := unstructured.SetNestedField(o.Object, stamp, "spec", "template", "metadata", "annotations", stampAnnotation); err != nil {
				return nil, err
			}
		}
	}
	return objs, nil
}

func (secretStamp) DigestInputs(_ context.Context, rc plugin.RenderContext, _ []*unstructured.Unstructured) ([]plugin.ObjectRef, error) {
	return []plugin.ObjectRef{{GVK: corev1.SchemeGroupVersion.WithKind("Secret"), Namespace: rc.Owner.GetNamespace(), Name: rc.Owner.GetName() + "-token"}}, nil
}
