package kueue

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"

	certutil "k8s.io/client-go/util/cert"
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
	certPEM, keyPEM, err := serving()
	if err != nil {
		return nil, err
	}
	// client-go's certificate is the serving one followed by its CA.
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("kueue: the generated certificate: %w", err)
	}
	if len(certs) < 2 || !certs[len(certs)-1].IsCA {
		return nil, fmt.Errorf("kueue: the generated certificate has no CA (%d certificates)", len(certs))
	}
	caPEM, err := certutil.EncodeCertificates(certs[len(certs)-1])
	if err != nil {
		return nil, fmt.Errorf("kueue: %w", err)
	}
	p := &pki{caPEM: caPEM, certDir: filepath.Join(dir, "certs")}
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

// serving is a certificate for 127.0.0.1 and localhost, signed by a CA of
// its own, and its key, in PEM.
func serving() (certPEM, keyPEM []byte, err error) {
	certPEM, keyPEM, err = certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	if err != nil {
		return nil, nil, fmt.Errorf("kueue: serving certificate: %w", err)
	}
	return certPEM, keyPEM, nil
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
	certPEM, keyPEM, err := serving()
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
