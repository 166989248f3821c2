package helmreconciler

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"helm.sh/helm/v3/pkg/release"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Release storage.
//
// Releases are stored as Helm stores them (driver "secret": one Secret
// sh.helm.release.v1.<name>.v<revision> per revision, labelled owner=helm),
// so `helm list`, `helm history` and `helm get` work on them. The engine wraps
// the Secrets client that Helm's driver uses to add three things:
//
//   - a controller owner reference to the custom resource, so that the
//     garbage collector removes the history if the resource is ever deleted
//     without the finalizer running;
//   - the engine label, so that the operator's cache sees the release Secrets
//     (metadata only) and a no-op reconcile reads nothing from the API;
//   - chunking: Kubernetes refuses a Secret over 1 MiB, and Helm's encoded
//     release (gzip of chart, values and manifest) can exceed it. A larger
//     release is split: the first chunk stays in the usual Secret, labelled
//     with the number of chunks, and the rest go to Secrets named
//     <secret>.chunk-<i> of type modelorchestra.io/release-chunk.v1. The helm
//     CLI cannot decode a chunked release; the operator can.

const (
	// DefaultChunkSize is the largest release data kept in one Secret. It
	// leaves room under the 1 MiB Secret limit for metadata.
	DefaultChunkSize = 1000 * 1024

	labelChunks     = "modelorchestra.io/release-chunks"
	labelChunkOf    = "modelorchestra.io/release-chunk-of"
	chunkSecretType = corev1.SecretType("modelorchestra.io/release-chunk.v1")
	releaseDataKey  = "release"
)

// releaseSecrets is a SecretInterface for Helm's Secrets driver.
type releaseSecrets struct {
	corev1client.SecretInterface
	owner     *metav1.OwnerReference
	labels    map[string]string
	chunkSize int
	// chunks remembers how many chunks this process wrote per Secret
	// (namespace/name -> int), which saves a read before each update.
	chunks *sync.Map
	// lists holds the answers of List since the last write through this
	// client. One Helm action lists the release's history up to three
	// times before its first write (the reconcile's plan, Install's
	// availableName and replaceRelease), and each list reads every Secret
	// of the namespace from etcd; one action configuration serves one
	// reconcile, and the controller never reconciles a resource twice at
	// once, so only other writers could change the history in between, as
	// they could between Helm's own reads.
	lists listMemo
	// background, when set, takes the update that records a release
	// deployed (Helm's last write of an install or upgrade, whose error Helm
	// only logs) off Helm's path, so that it overlaps the status write.
	// Every other call through this client waits for it first.
	background *backgroundWrites
}

// backgroundWrites are the release writes of one reconcile still in
// flight; the reconcile waits for them before it returns.
type backgroundWrites struct {
	wg  sync.WaitGroup
	mu  sync.Mutex
	err error
}

func (b *backgroundWrites) run(f func() error) {
	b.wg.Go(func() {
		if err := f(); err != nil {
			b.mu.Lock()
			b.err = errors.Join(b.err, err)
			b.mu.Unlock()
		}
	})
}

// wait waits for the writes in flight and returns their errors.
func (b *backgroundWrites) wait() error {
	if b == nil {
		return nil
	}
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// settle waits for background writes before a call that reads or writes
// release Secrets, so that it sees them.
func (s *releaseSecrets) settle() {
	if s.background != nil {
		s.background.wg.Wait()
	}
}

// listMemo remembers List answers by selector until the next write.
type listMemo struct {
	mu   sync.Mutex
	byOp map[string]*corev1.SecretList
}

func listKey(opts metav1.ListOptions) (string, bool) {
	if opts.ResourceVersion != "" || opts.Limit != 0 || opts.Continue != "" || opts.Watch {
		return "", false
	}
	return opts.LabelSelector + "\x00" + opts.FieldSelector, true
}

func (m *listMemo) get(opts metav1.ListOptions) *corev1.SecretList {
	k, ok := listKey(opts)
	if !ok {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.byOp[k]; ok {
		return l.DeepCopy()
	}
	return nil
}

func (m *listMemo) put(opts metav1.ListOptions, l *corev1.SecretList) {
	k, ok := listKey(opts)
	if !ok {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.byOp == nil {
		m.byOp = map[string]*corev1.SecretList{}
	}
	m.byOp[k] = l.DeepCopy()
}

func (m *listMemo) forget() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.byOp = nil
}

func (s *releaseSecrets) remember(sec *corev1.Secret, n int) {
	if s.chunks != nil {
		s.chunks.Store(sec.Namespace+"/"+sec.Name, n)
	}
}

func (s *releaseSecrets) decorate(sec *corev1.Secret) {
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	for k, v := range s.labels {
		sec.Labels[k] = v
	}
	if s.owner != nil {
		sec.OwnerReferences = []metav1.OwnerReference{*s.owner}
	}
}

func chunkName(main string, i int) string { return main + ".chunk-" + strconv.Itoa(i) }

func (s *releaseSecrets) split(sec *corev1.Secret) (head []byte, rest [][]byte) {
	data := sec.Data[releaseDataKey]
	size := s.chunkSize
	if size <= 0 {
		size = DefaultChunkSize
	}
	if len(data) <= size {
		return data, nil
	}
	head, data = data[:size], data[size:]
	for len(data) > 0 {
		n := min(size, len(data))
		rest = append(rest, data[:n])
		data = data[n:]
	}
	return head, rest
}

func (s *releaseSecrets) writeChunks(ctx context.Context, main *corev1.Secret, rest [][]byte) error {
	for i, part := range rest {
		c := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name:      chunkName(main.Name, i+1),
				Namespace: main.Namespace,
				Labels:    map[string]string{labelChunkOf: main.Labels["name"]},
			},
			Type: chunkSecretType,
			Data: map[string][]byte{releaseDataKey: part},
		}
		for k, v := range s.labels {
			c.Labels[k] = v
		}
		if s.owner != nil {
			c.OwnerReferences = []metav1.OwnerReference{*s.owner}
		}
		_, err := s.SecretInterface.Create(ctx, c, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			_, err = s.SecretInterface.Update(ctx, c, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("writing release chunk %s: %w", c.Name, err)
		}
	}
	return nil
}

func (s *releaseSecrets) deleteChunks(ctx context.Context, main string, from, to int) error {
	for i := from; i < to; i++ {
		err := s.SecretInterface.Delete(ctx, chunkName(main, i), metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting release chunk %s: %w", chunkName(main, i), err)
		}
	}
	return nil
}

func chunkCount(sec *corev1.Secret) int {
	n, err := strconv.Atoi(sec.Labels[labelChunks])
	if err != nil || n < 1 {
		return 1
	}
	return n
}

// join reads the chunks of sec, if any, into its release data.
func (s *releaseSecrets) join(ctx context.Context, sec *corev1.Secret) (*corev1.Secret, error) {
	n := chunkCount(sec)
	if n == 1 {
		return sec, nil
	}
	var b bytes.Buffer
	b.Write(sec.Data[releaseDataKey])
	for i := 1; i < n; i++ {
		c, err := s.SecretInterface.Get(ctx, chunkName(sec.Name, i), metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("reading release chunk %d/%d of %s: %w", i+1, n, sec.Name, err)
		}
		b.Write(c.Data[releaseDataKey])
	}
	out := sec.DeepCopy()
	out.Data[releaseDataKey] = b.Bytes()
	return out, nil
}

func (s *releaseSecrets) Create(ctx context.Context, sec *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	s.settle()
	s.lists.forget()
	defer s.lists.forget()
	sec = sec.DeepCopy()
	s.decorate(sec)
	head, rest := s.split(sec)
	if len(rest) > 0 {
		if _, err := s.SecretInterface.Get(ctx, sec.Name, metav1.GetOptions{}); err == nil {
			return nil, apierrors.NewAlreadyExists(corev1.Resource("secrets"), sec.Name)
		}
		if err := s.writeChunks(ctx, sec, rest); err != nil {
			return nil, err
		}
		sec.Data[releaseDataKey] = head
		sec.Labels[labelChunks] = strconv.Itoa(len(rest) + 1)
	}
	out, err := s.SecretInterface.Create(ctx, sec, opts)
	if err == nil {
		s.remember(sec, len(rest)+1)
	}
	return out, err
}

func (s *releaseSecrets) Update(ctx context.Context, sec *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	s.settle()
	if s.background != nil && sec.Labels["status"] == string(release.StatusDeployed) {
		s.lists.forget()
		sec = sec.DeepCopy()
		s.background.run(func() error {
			if _, err := s.update(ctx, sec, opts); err != nil {
				return fmt.Errorf("recording release %s deployed: %w", sec.Name, err)
			}
			return nil
		})
		return sec, nil
	}
	return s.update(ctx, sec, opts)
}

func (s *releaseSecrets) update(ctx context.Context, sec *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	s.lists.forget()
	defer s.lists.forget()
	sec = sec.DeepCopy()
	s.decorate(sec)
	oldN := 1
	if n, ok := s.knownChunks(sec); ok {
		oldN = n
	} else {
		old, err := s.SecretInterface.Get(ctx, sec.Name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, err
		}
		if err == nil {
			oldN = chunkCount(old)
		}
	}
	head, rest := s.split(sec)
	if len(rest) > 0 {
		if err := s.writeChunks(ctx, sec, rest); err != nil {
			return nil, err
		}
		sec.Data[releaseDataKey] = head
		sec.Labels[labelChunks] = strconv.Itoa(len(rest) + 1)
	}
	out, err := s.SecretInterface.Update(ctx, sec, opts)
	if err != nil {
		return nil, err
	}
	s.remember(sec, len(rest)+1)
	return out, s.deleteChunks(ctx, sec.Name, len(rest)+1, oldN)
}

func (s *releaseSecrets) knownChunks(sec *corev1.Secret) (int, bool) {
	if s.chunks == nil {
		return 0, false
	}
	v, ok := s.chunks.Load(sec.Namespace + "/" + sec.Name)
	if !ok {
		return 0, false
	}
	return v.(int), true
}

func (s *releaseSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	s.settle()
	sec, err := s.SecretInterface.Get(ctx, name, opts)
	if err != nil {
		return nil, err
	}
	return s.join(ctx, sec)
}

func (s *releaseSecrets) List(ctx context.Context, opts metav1.ListOptions) (*corev1.SecretList, error) {
	s.settle()
	if list := s.lists.get(opts); list != nil {
		return list, nil
	}
	list, err := s.SecretInterface.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		joined, err := s.join(ctx, &list.Items[i])
		if err != nil {
			return nil, err
		}
		list.Items[i] = *joined
	}
	s.lists.put(opts, list)
	return list, nil
}

func (s *releaseSecrets) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	s.settle()
	s.lists.forget()
	defer s.lists.forget()
	sec, err := s.SecretInterface.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if err := s.SecretInterface.Delete(ctx, name, opts); err != nil {
		return err
	}
	if s.chunks != nil {
		s.chunks.Delete(sec.Namespace + "/" + name)
	}
	return s.deleteChunks(ctx, name, 1, chunkCount(sec))
}

// releaseSelector selects the Secrets of release name (all revisions); its
// String is the selector Helm's Secrets driver lists the history with.
func releaseSelector(name string) labels.Selector {
	return labels.SelectorFromSet(labels.Set{"owner": "helm", "name": name})
}
