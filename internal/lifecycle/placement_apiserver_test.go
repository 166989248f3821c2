package lifecycle_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"

	"github.com/model-orchestra/operator/internal/lifecycle"
	"github.com/model-orchestra/operator/internal/localcluster"
)

// TestTheWeightsLabelGrantIsLeastPrivilege applies the administrator's
// grant (config/weights-labels/weights-labels.yaml) to a real API server
// and binds it to a release's dispatcher: the dispatcher sets and removes
// its weights labels with the leader's merge patch, and is refused every
// other change of a node (another label, an annotation, its spec) and any
// read of nodes.
func TestTheWeightsLabelGrantIsLeastPrivilege(t *testing.T) {
	cluster := localcluster.StartForTest(t, localcluster.Options{})
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(cluster.Config())
	data, err := os.ReadFile("../../config/weights-labels/weights-labels.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := dec.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("decoding %s: %v", doc, err)
		}
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			_, err = admin.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *admissionv1.ValidatingAdmissionPolicy:
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			_, err = admin.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("unexpected %T in the grant", obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	const ns, sa, node = "team", "rel-dispatcher", "gpu-1"
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "model-orchestra-weights-labels-team-rel"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "model-orchestra-weights-labels"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"kubernetes.io/hostname": node}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dispatcher := kubernetes.NewForConfigOrDie(cluster.ImpersonateServiceAccount(ns, sa))
	key := "weights.modelorchestra.io/team.rel-chat"
	hot := "hot"
	patch := func(body string) error {
		_, err := dispatcher.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(body), metav1.PatchOptions{})
		return err
	}

	// The policy takes effect once the API server's admission has loaded
	// it: until a change of another label is refused, wait.
	deadline := time.Now().Add(30 * time.Second)
	for i := 0; ; i++ {
		err := patch(`{"metadata":{"labels":{"team":"a` + strconv.Itoa(i) + `"}}}`) // a change each time
		if err != nil && strings.Contains(err.Error(), "only the node labels under weights.modelorchestra.io/") {
			break
		}
		if time.Now().After(deadline) {
			pol, _ := admin.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "model-orchestra-weights-labels", metav1.GetOptions{})
			t.Fatalf("a dispatcher's change of another node label: %v; want it refused by the policy (policy status %+v)", err, pol.Status)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n, _ := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if _, ok := n.Labels["team"]; ok {
		// Before the policy loaded, the probe above may have passed once.
		if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":null}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	if err := lifecycle.PatchNodeLabels(ctx, dispatcher, lifecycle.LabelPatch{Node: node, Labels: map[string]*string{key: &hot}}); err != nil {
		t.Fatalf("the dispatcher setting its weights label: %v", err)
	}
	if n, _ := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); n.Labels[key] != "hot" || n.Labels["kubernetes.io/hostname"] != node {
		t.Fatalf("node labels %v after the patch; want %s=hot and the others kept", n.Labels, key)
	}
	if err := lifecycle.PatchNodeLabels(ctx, dispatcher, lifecycle.LabelPatch{Node: node, Labels: map[string]*string{key: nil}}); err != nil {
		t.Fatalf("the dispatcher removing its weights label: %v", err)
	}
	if n, _ := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); n.Labels[key] != "" {
		t.Fatalf("node labels %v after the removal", n.Labels)
	}
	for what, body := range map[string]string{
		"removing another label": `{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`,
		"an annotation":          `{"metadata":{"annotations":{"x":"y"}}}`,
		"cordoning the node":     `{"spec":{"unschedulable":true}}`,
		"a taint":                `{"spec":{"taints":[{"key":"x","effect":"NoSchedule"}]}}`,
	} {
		if err := patch(body); err == nil {
			t.Errorf("the dispatcher was allowed %s", what)
		} else {
			t.Logf("%s: refused: %v", what, err)
		}
	}
	if _, err := dispatcher.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the dispatcher reading a node: %v; want Forbidden (patch is its only verb)", err)
	}
	if _, err := dispatcher.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the dispatcher listing nodes: %v; want Forbidden", err)
	}
}
