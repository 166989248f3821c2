package helmreconciler

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"time"

	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// releaseDriver is Helm's Secrets driver with its own encoding of the
// records it writes; reads are Helm's. The records are the ones Helm
// writes (same name, type, labels and encoding: base64 of gzip of the
// release's JSON), compressed at gzip's default level with pooled
// compressors instead of a new BestCompression compressor per record: a
// new compressor allocates its tables (close to a megabyte) on every
// write, and the best level is slower than the default one for records of
// about the same size. Any level decodes alike: the helm CLI reads them as
// its own (TestReleaseRecordsAreHelms).
//
// An install of a release without hooks is recorded once: Helm creates the
// record pending-install before it creates the objects and updates it to
// deployed after, and the driver instead creates it deployed, "Install
// complete", as Helm's update would have written it, and drops that update
// (see recordedDeployed). The record, with its manifest, still exists
// before any object of the release does, which is what recovery needs: an
// operator killed between the record and the objects leaves a deployed
// release some of whose objects are missing, and the next reconcile
// creates them (drift repair; TestKilledInstallIsCompletedFromItsRecord).
// An install that fails updates the record to failed, as Helm does. A
// release with hooks keeps Helm's two writes: its hooks run between them,
// and a crash there must be seen as an unfinished install.
type releaseDriver struct {
	*driver.Secrets
	secrets *releaseSecrets

	// stored, when set, is told of each record before it is created.
	stored func(*release.Release)

	mu sync.Mutex
	// recordedDeployed holds the keys of the records this driver created
	// deployed in place of pending-install; the deployed update of one is
	// not written again.
	recordedDeployed map[string]bool
}

func newReleaseDriver(secrets *releaseSecrets, log func(string, ...any)) *releaseDriver {
	d := driver.NewSecrets(secrets)
	d.Log = log
	return &releaseDriver{Secrets: d, secrets: secrets}
}

// gzipWriters are the compressors of release records, reused.
var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

// encodeRelease is Helm's record encoding.
func encodeRelease(rls *release.Release) ([]byte, error) {
	b, err := json.Marshal(rls)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	w := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(w)
	w.Reset(&buf)
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	out := make([]byte, base64.StdEncoding.EncodedLen(buf.Len()))
	base64.StdEncoding.Encode(out, buf.Bytes())
	return out, nil
}

// releaseSecret is the Secret Helm's driver writes for rls under key;
// stamp is the time label Helm sets ("createdAt" on create, "modifiedAt"
// on update).
func releaseSecret(key string, rls *release.Release, stamp string) (*corev1.Secret, error) {
	data, err := encodeRelease(rls)
	if err != nil {
		return nil, err
	}
	l := make(map[string]string, len(rls.Labels)+5)
	maps.Copy(l, rls.Labels)
	l[stamp] = strconv.FormatInt(time.Now().Unix(), 10)
	l["name"] = rls.Name
	l["owner"] = "helm"
	l["status"] = rls.Info.Status.String()
	l["version"] = strconv.Itoa(rls.Version)
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key, Labels: l},
		Type:       "helm.sh/release.v1",
		Data:       map[string][]byte{releaseDataKey: data},
	}, nil
}

// Create is Helm's Secrets.Create with this driver's encoding; a hookless
// install's pending record is created deployed.
func (d *releaseDriver) Create(key string, rls *release.Release) error {
	if d.stored != nil {
		d.stored(rls)
	}
	early := rls.Info != nil && rls.Info.Status == release.StatusPendingInstall && len(rls.Hooks) == 0
	if early {
		rls = deployedCopy(rls)
	}
	sec, err := releaseSecret(key, rls, "createdAt")
	if err != nil {
		return fmt.Errorf("create: failed to encode release %q: %w", rls.Name, err)
	}
	if _, err := d.secrets.Create(context.Background(), sec, metav1.CreateOptions{}); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return driver.ErrReleaseExists
		}
		return fmt.Errorf("create: failed to create: %w", err)
	}
	if early {
		d.mu.Lock()
		if d.recordedDeployed == nil {
			d.recordedDeployed = map[string]bool{}
		}
		d.recordedDeployed[key] = true
		d.mu.Unlock()
	}
	return nil
}

// deployedCopy is rls as Helm's install records it once its objects are
// created; rls itself is left pending, as Helm holds it.
func deployedCopy(rls *release.Release) *release.Release {
	c := *rls
	info := *rls.Info
	c.Info = &info
	c.SetStatus(release.StatusDeployed, "Install complete")
	return &c
}

// Update is Helm's Secrets.Update with this driver's encoding. The
// deployed update of a record created deployed is not written: the stored
// record already is that update.
func (d *releaseDriver) Update(key string, rls *release.Release) error {
	d.mu.Lock()
	early := d.recordedDeployed[key]
	delete(d.recordedDeployed, key)
	d.mu.Unlock()
	if early && rls.Info != nil && rls.Info.Status == release.StatusDeployed {
		return nil
	}
	sec, err := releaseSecret(key, rls, "modifiedAt")
	if err != nil {
		return fmt.Errorf("update: failed to encode release %q: %w", rls.Name, err)
	}
	if _, err := d.secrets.Update(context.Background(), sec, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: failed to update: %w", err)
	}
	return nil
}
