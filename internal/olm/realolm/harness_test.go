package realolm

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/model-orchestra/operator/internal/localcluster"
	"github.com/model-orchestra/operator/internal/polltest"
)

// repoRoot is the module root, relative to this package.
const repoRoot = "../../.."

// binDir is where hack/tools/install.sh puts the pinned tools: $MO_BIN_DIR
// (the Makefile sets it), else <module root>/bin.
func binDir(t *testing.T) string {
	t.Helper()
	if d := os.Getenv("MO_BIN_DIR"); d != "" {
		return d
	}
	d, err := filepath.Abs(filepath.Join(repoRoot, "bin"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// requireTools skips t, saying how to get them, when the pinned OLM, opm or
// kubectl binaries are absent.
func requireTools(t *testing.T, bin string) {
	t.Helper()
	for _, f := range []string{"olm", "catalog", "olm-crds.yaml", "opm", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, f)); err != nil {
			t.Skipf("the real-OLM tier needs %s in %s: run hack/tools/install.sh olm opm kubernetes (make test does)", f, bin)
		}
	}
}

// env is the test's view of the cluster and the tools.
type env struct {
	t          *testing.T
	bin        string
	kubeconfig string
	logDir     string
}

// kubectl runs the pinned kubectl against the cluster, as a user would;
// it fails the test on error and returns stdout.
func (e *env) kubectl(args ...string) string {
	e.t.Helper()
	out, err := e.run("kubectl", args...)
	if err != nil {
		e.t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// sh runs a command line with the pinned tools first in PATH.
func (e *env) sh(name string, args ...string) string {
	e.t.Helper()
	out, err := e.run(name, args...)
	if err != nil {
		e.t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

func (e *env) run(name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	if name == "kubectl" {
		cmd.Path = filepath.Join(e.bin, "kubectl")
	}
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.kubeconfig, "PATH="+e.bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// start runs a long-lived process with its output in <logDir>/<name>.log,
// and stops it in t.Cleanup. Its log tail is printed if the test failed.
func (e *env) start(name, path string, args []string, extraEnv ...string) {
	e.t.Helper()
	logPath := filepath.Join(e.logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		e.t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+e.kubeconfig), extraEnv...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		e.t.Fatalf("starting %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	e.t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		_ = f.Close()
		if e.t.Failed() {
			data, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			if len(lines) > 40 {
				lines = lines[len(lines)-40:]
			}
			e.t.Logf("--- last lines of %s:\n%s", logPath, strings.Join(lines, "\n"))
		}
	})
}

// freePort returns a TCP port free on 127.0.0.1 now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

// waitPort waits until something accepts connections on 127.0.0.1:port.
func waitPort(t *testing.T, port int, within time.Duration) {
	t.Helper()
	eventually(t, within, func() error {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

// selfSignedTLS writes a self-signed certificate and key for 127.0.0.1
// into dir and returns their paths.
func selfSignedTLS(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "olm-catalog-metrics"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	cert, key = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// eventually polls f every 500 ms until it passes (polltest.Eventually).
func eventually(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Eventually(t, within, 500*time.Millisecond, f)
}

// consistently calls f every 500 ms for the whole of within and fails the
// test at its first error (polltest.Consistently).
func consistently(t testing.TB, within time.Duration, f func() error) {
	t.Helper()
	polltest.Consistently(t, within, 500*time.Millisecond, f)
}

// startOLM starts the local control plane, OLM v0's CRDs and namespace,
// opm serving catalogDir on a free port, and OLM's olm and catalog
// controllers. It returns the environment, the cluster and opm's address.
//
// Both OLM controllers serve health and metrics on a port OLM hard-codes
// (no flag): :8080, or :8443 with TLS. catalog runs with a self-signed
// certificate, so the two do not clash; a port another program holds only
// makes OLM log an error (it keeps running, and this test does not use the
// port). opm's own profiling endpoint is turned off.
func startOLM(t *testing.T, catalogDir string) (*env, *localcluster.Cluster, string) {
	t.Helper()
	localcluster.SkipUnderShort(t)
	bin := binDir(t)
	requireTools(t, bin)
	c := localcluster.StartForTest(t, localcluster.Options{
		ControllerManager: true,
		Scheduler:         true,
		KwokNodes:         []localcluster.KwokNode{{Name: "kwok-0"}},
	})
	e := &env{t: t, bin: bin, kubeconfig: c.KubeconfigFile(), logDir: t.TempDir()}

	// OLM's CRDs (deploy/chart/crds of the pinned module, copied by
	// install.sh) and its namespace: nothing else (no packageserver).
	e.kubectl("apply", "--server-side", "-f", filepath.Join(bin, "olm-crds.yaml"))
	e.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
	e.kubectl("create", "namespace", "olm")

	address := e.serveCatalog("opm", catalogDir)
	work := t.TempDir()

	e.start("olm", filepath.Join(bin, "olm"), []string{"--namespace", "olm",
		"--writeStatusName", "", "--writePackageServerStatusName", ""})
	cert, key := selfSignedTLS(t, work)
	e.start("catalog", filepath.Join(bin, "catalog"), []string{"--kubeconfig", e.kubeconfig, "--namespace", "olm",
		"--writeStatusName", "", "--tls-cert", cert, "--tls-key", key, "--client-ca", cert})
	return e, c, address
}

// serveCatalog serves the FBC in dir with opm over gRPC on a free port and
// returns its address. opm's profiling endpoint is turned off.
func (e *env) serveCatalog(name, dir string) string {
	e.t.Helper()
	port := freePort(e.t)
	abs, err := filepath.Abs(dir)
	if err != nil {
		e.t.Fatal(err)
	}
	e.start(name, filepath.Join(e.bin, "opm"), []string{"serve", abs, "--port", strconv.Itoa(port),
		"--pprof-addr", "", "--termination-log", filepath.Join(e.logDir, name+"-termination.log")})
	waitPort(e.t, port, 60*time.Second)
	return "127.0.0.1:" + strconv.Itoa(port)
}

// ctx is the tests' context.
var ctx = context.Background()
