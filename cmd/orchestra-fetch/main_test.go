package main

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"testing"
)

const rootsChildEnv = "ORCHESTRA_FETCH_TEST_ROOTS_CHILD"

// TestTrustsPublicCAsWithoutSystemCertificates runs in a child process
// (the system pool is loaded once per process) that finds no system
// certificates, as in the fetch image, and checks that a public root CA
// still verifies.
func TestTrustsPublicCAsWithoutSystemCertificates(t *testing.T) {
	if os.Getenv(rootsChildEnv) != "" {
		checkRoots(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestTrustsPublicCAsWithoutSystemCertificates$", "-test.v")
	cmd.Env = append(os.Environ(), rootsChildEnv+"=1", "SSL_CERT_FILE=/nonexistent", "SSL_CERT_DIR=/nonexistent")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("without system certificates: %v\n%s", err, out)
	}
}

func checkRoots(t *testing.T) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		t.Fatalf("SystemCertPool: %v", err)
	}
	if pool.Equal(x509.NewCertPool()) {
		t.Fatal("the system certificate pool is empty")
	}
	b, err := os.ReadFile("testdata/amazon-root-ca-1.pem")
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatal("testdata/amazon-root-ca-1.pem: no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{}); err != nil {
		t.Errorf("verifying %s against the default roots: %v", cert.Subject, err)
	}
}
