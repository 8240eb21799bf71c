package kueue

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// MetricsCertDir is where Kueue v0.17.0 reads its metrics server's
// certificate when its own certificate management is off: a fixed path in
// cmd/kueue/main.go, no setting moves it. Without tls.crt and tls.key there
// the manager exits at start.
const MetricsCertDir = "/etc/kueue/metrics/certs"

// pki is the certificates of one Kueue: a CA, and the webhook server's
// certificate it signed, for 127.0.0.1 (the API server calls the webhooks
// by URL, outside a cluster there is no Service to name).
type pki struct {
	caPEM   []byte
	certDir string // tls.crt and tls.key of the webhook server
}

// newPKI writes a fresh CA's serving certificate for 127.0.0.1 and
// localhost into dir.
func newPKI(dir string) (*pki, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "raydrop local cloud Kueue CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(30 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("kueue: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	certPEM, keyPEM, err := serving(ca, caKey, now)
	if err != nil {
		return nil, err
	}
	p := &pki{caPEM: pemBlock("CERTIFICATE", caDER), certDir: filepath.Join(dir, "certs")}
	if err := os.MkdirAll(p.certDir, 0o700); err != nil {
		return nil, err
	}
	for name, b := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(p.certDir, name), b, 0o600); err != nil {
			return nil, fmt.Errorf("kueue: %w", err)
		}
	}
	return p, nil
}

// serving is a certificate for 127.0.0.1 and localhost signed by ca
// (self-signed when caKey is nil), and its key, in PEM.
func serving(ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(30 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	parent, signer := ca, caKey
	if caKey == nil {
		parent, signer = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("kueue: serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER), nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

// ensureMetricsCerts puts a self-signed certificate for 127.0.0.1 in
// MetricsCertDir unless one is there (every local Kueue on the machine
// shares it; its metrics are served on 127.0.0.1 only). The files are
// written under a lock, and each written whole then renamed into place:
// Kueues starting side by side never read half of one, nor a key of
// another certificate.
func ensureMetricsCerts() error {
	if err := os.MkdirAll(MetricsCertDir, 0o755); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			return fmt.Errorf("kueue: Kueue %s reads its metrics certificate from %s, which this user may not create: run `make tools` (it creates the folder with sudo) or `sudo install -d -o $(id -u) %s`", Version, MetricsCertDir, MetricsCertDir)
		}
		return fmt.Errorf("kueue: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(MetricsCertDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("kueue: metrics certificate: %w", err)
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("kueue: metrics certificate: %w", err)
	}
	crt, key := filepath.Join(MetricsCertDir, "tls.crt"), filepath.Join(MetricsCertDir, "tls.key")
	if _, err := tls.LoadX509KeyPair(crt, key); err == nil {
		return nil
	}
	certPEM, keyPEM, err := serving(nil, nil, time.Now())
	if err != nil {
		return err
	}
	for _, f := range []struct {
		path string
		b    []byte
	}{{key, keyPEM}, {crt, certPEM}} {
		tmp, err := os.CreateTemp(MetricsCertDir, ".tls-*")
		if err != nil {
			return fmt.Errorf("kueue: metrics certificate: %w", err)
		}
		_, werr := tmp.Write(f.b)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr, os.Rename(tmp.Name(), f.path)); err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("kueue: metrics certificate: %w", err)
		}
	}
	return nil
}
