package localcluster

import (
	"crypto"
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
	"path/filepath"
	"time"
)

// certValidity is long enough for a dev cluster that stays up for weeks.
const certValidity = 365 * 24 * time.Hour

// keyPair is a PEM-encoded certificate and private key.
type keyPair struct {
	CertPEM []byte
	KeyPEM  []byte
	cert    *x509.Certificate
	key     crypto.Signer
}

// certSpec describes a certificate signed by the cluster CA.
type certSpec struct {
	CommonName   string
	Organization []string
	Server       bool // serverAuth; else clientAuth
	DNSNames     []string
	IPs          []net.IP
}

// pki holds everything the components need to trust each other.
type pki struct {
	CA *keyPair
	// ServiceAccountKeyPEM signs and verifies ServiceAccount tokens.
	ServiceAccountKeyPEM    []byte
	ServiceAccountPubKeyPEM []byte
}

func newKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// newPKI creates a CA and a ServiceAccount signing key.
func newPKI(name string) (*pki, error) {
	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name + "-ca"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	saKey, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("generating service account key: %w", err)
	}
	saKeyPEM, err := encodeKey(saKey)
	if err != nil {
		return nil, err
	}
	saPubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	return &pki{
		CA: &keyPair{
			CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			KeyPEM:  keyPEM,
			cert:    cert,
			key:     key,
		},
		ServiceAccountKeyPEM:    saKeyPEM,
		ServiceAccountPubKeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPubDER}),
	}, nil
}

// issue signs a certificate for spec with the CA.
func (p *pki) issue(spec certSpec) (*keyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, fmt.Errorf("generating key for %s: %w", spec.CommonName, err)
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	usage := x509.ExtKeyUsageClientAuth
	if spec.Server {
		usage = x509.ExtKeyUsageServerAuth
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: spec.CommonName, Organization: spec.Organization},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{usage},
		BasicConstraintsValid: true,
		DNSNames:              spec.DNSNames,
		IPAddresses:           spec.IPs,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CA.cert, key.Public(), p.CA.key)
	if err != nil {
		return nil, fmt.Errorf("signing certificate for %s: %w", spec.CommonName, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &keyPair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  keyPEM,
		key:     key,
	}, nil
}

// write stores the pair as <dir>/<name>.crt and <dir>/<name>.key and
// returns both paths.
func (k *keyPair) write(dir, name string) (certFile, keyFile string, err error) {
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, k.CertPEM, 0o644); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, k.KeyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}
