package kubesim

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
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/cri-client/pkg/logs"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// The kubelet's HTTPS endpoint, as the kube-apiserver reaches it: the API
// server answers GET /api/v1/namespaces/N/pods/P/log (client-go's
// Pods(ns).GetLogs) by proxying to https://<node's InternalIP>:<node's
// kubelet port>/containerLogs/N/P/C with the request's options as query
// parameters (k8s.io/kubernetes pkg/registry/core/pod/strategy.go,
// LogLocation). Every simulated node has InternalIP 127.0.0.1 and this one
// server's port, so the API server's own proxy serves pod logs here.
//
// Authentication is the kubelet's: the API server presents a client
// certificate (--kubelet-client-certificate) that this server verifies
// against its client CA, and verifies this server's certificate (IP SAN
// 127.0.0.1) against --kubelet-certificate-authority. The kubelet's
// authorization (a SubjectAccessReview for nodes/proxy) is not played:
// only the API server holds a certificate this server accepts.

// kubeletPKI is the certificates the API server and the kubelet stand-in
// share, as files the API server's flags name.
type kubeletPKI struct {
	dir                       string
	caFile, certFile, keyFile string // the CA, the API server's client certificate and key
	serving                   tls.Certificate
	pool                      *x509.CertPool
}

// newKubeletPKI makes a CA, the stand-in's serving certificate (IP SAN
// 127.0.0.1) and the API server's client certificate, all signed by the CA,
// under dir.
func newKubeletPKI(dir string) (*kubeletPKI, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("kubesim: kubelet CA key: %w", err)
	}
	ca, err := certutil.NewSelfSignedCACert(certutil.Config{CommonName: "localcloud-kubelet-ca"}, caKey)
	if err != nil {
		return nil, fmt.Errorf("kubesim: kubelet CA: %w", err)
	}
	p := &kubeletPKI{dir: dir, pool: x509.NewCertPool()}
	p.pool.AddCert(ca)
	p.caFile = filepath.Join(dir, "kubelet-ca.crt")
	if err := writePEM(p.caFile, "CERTIFICATE", ca.Raw); err != nil {
		return nil, err
	}
	servingDER, servingKey, err := signLeaf(ca, caKey, pkix.Name{CommonName: "localcloud-kubelet"}, x509.ExtKeyUsageServerAuth, []net.IP{net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	p.serving = tls.Certificate{Certificate: [][]byte{servingDER}, PrivateKey: servingKey}
	// GKE's API server authenticates to kubelets as a member of
	// system:masters; the name is what kubeadm gives the same certificate.
	clientDER, clientKey, err := signLeaf(ca, caKey, pkix.Name{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth, nil)
	if err != nil {
		return nil, err
	}
	p.certFile, p.keyFile = filepath.Join(dir, "apiserver-kubelet-client.crt"), filepath.Join(dir, "apiserver-kubelet-client.key")
	if err := writePEM(p.certFile, "CERTIFICATE", clientDER); err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		return nil, fmt.Errorf("kubesim: encode key: %w", err)
	}
	if err := writePEM(p.keyFile, "EC PRIVATE KEY", der); err != nil {
		return nil, err
	}
	return p, nil
}

// signLeaf issues a certificate for name with one extended key usage,
// valid for a day, signed by the CA.
func signLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey, name pkix.Name, usage x509.ExtKeyUsage, ips []net.IP) ([]byte, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("kubesim: key for %s: %w", name.CommonName, err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, fmt.Errorf("kubesim: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: name, IPAddresses: ips,
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, fmt.Errorf("kubesim: certificate for %s: %w", name.CommonName, err)
	}
	return der, key, nil
}

func writePEM(path, typ string, der []byte) error {
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return fmt.Errorf("kubesim: %w", err)
	}
	return nil
}

// configure gives the API server the flags that make it reach kubelets here:
// by the nodes' InternalIP, with this client certificate, verifying the
// kubelet's certificate against this CA (without a CA it would skip the
// verification).
func (p *kubeletPKI) configure(api *envtest.APIServer) {
	args := api.Configure()
	args.Set("kubelet-preferred-address-types", string(corev1.NodeInternalIP))
	args.Set("kubelet-client-certificate", p.certFile)
	args.Set("kubelet-client-key", p.keyFile)
	args.Set("kubelet-certificate-authority", p.caFile)
}

// kubeletServer is the kubelet's HTTPS endpoint for every simulated node.
type kubeletServer struct {
	pods   client.Reader // the pods' status, as the kubelet's status manager holds it
	logs   *containerLogs
	log    *slog.Logger
	srv    *http.Server
	lis    net.Listener
	port   int32
	served chan error
}

// startKubeletServer listens on 127.0.0.1 and serves the container log
// endpoint.
func startKubeletServer(pki *kubeletPKI, pods client.Reader, cl *containerLogs, log *slog.Logger) (*kubeletServer, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("kubesim: kubelet listen: %w", err)
	}
	k := &kubeletServer{pods: pods, logs: cl, log: log, lis: lis, port: int32(lis.Addr().(*net.TCPAddr).Port), served: make(chan error, 1)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{ns}/{pod}/{container}", k.containerLogs)
	k.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{pki.serving},
			ClientCAs:    pki.pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		},
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	go func() { k.served <- k.srv.ServeTLS(lis, "", "") }()
	return k, nil
}

// stop closes the server and its connections (a follow in progress ends).
func (k *kubeletServer) stop() error {
	err := k.srv.Close()
	if serr := <-k.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// containerLogs answers as the kubelet's getContainerLogs and
// GetKubeletContainerLogs do (k8s.io/kubernetes pkg/kubelet/server/server.go
// and pkg/kubelet/kubelet_pods.go): 404 for a pod or container it does not
// have, 400 with the reason when the container has nothing to read, else
// the log read by the kubelet's own reader, which honours tailLines,
// limitBytes, sinceSeconds, sinceTime, timestamps and follow.
func (k *kubeletServer) containerLogs(w http.ResponseWriter, r *http.Request) {
	ns, name, container := r.PathValue("ns"), r.PathValue("pod"), r.PathValue("container")
	query := r.URL.Query()
	if tail := query.Get("tail"); tail != "" { // the kubelet's old name for tailLines
		query["tailLines"] = []string{tail}
		if tail == "all" {
			delete(query, "tailLines")
		}
	}
	opts, err := podLogOptions(query)
	if err != nil {
		http.Error(w, `{"message": "Unable to decode query."}`, http.StatusBadRequest)
		k.log.Debug("kubelet: container log query", "query", query.Encode(), "err", err)
		return
	}
	if opts.Stream != nil && *opts.Stream != corev1.LogStreamAll {
		// The kubelet without the PodLogsQuerySplitStreams gate (alpha, off
		// in 1.34) refuses a single stream the same way.
		http.Error(w, fmt.Sprintf("unable to return the given log stream: %q. Please enable PodLogsQuerySplitStreams feature gate in kubelet", *opts.Stream), http.StatusBadRequest)
		return
	}
	pod := &corev1.Pod{}
	err = k.pods.Get(r.Context(), types.NamespacedName{Namespace: ns, Name: name}, pod)
	if apierrors.IsNotFound(err) {
		http.Error(w, fmt.Sprintf("pod %q does not exist", name), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if !hasContainer(pod, container) {
		http.Error(w, fmt.Sprintf("container %q not found in pod %q", container, name), http.StatusNotFound)
		return
	}
	id, err := containerLogID(pod, container, opts.Previous)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	path, ok := k.logs.path(id)
	if !ok {
		http.Error(w, fmt.Sprintf("failed to try resolving symlinks in path for container %q: no log file", id), http.StatusBadRequest)
		return
	}
	fw := flushWriter{w}
	w.Header().Set("Transfer-Encoding", "chunked")
	// A write before reading, as the kubelet does: the response (its
	// headers) goes out even while a follow waits for the first line.
	if _, err := fw.Write([]byte{}); err != nil {
		return
	}
	logger := klog.FromContext(r.Context())
	if err := logs.ReadLogs(r.Context(), &logger, path, id, logs.NewLogOptions(opts, time.Now()), k.logs, fw, fw); err != nil && r.Context().Err() == nil {
		k.log.Warn("kubelet: read container log", "pod", ns+"/"+name, "container", container, "err", err)
	}
}

// podLogOptions decodes the query the API server passes on (LogLocation):
// what the kubelet's parameter codec decodes for v1.PodLogOptions. The
// generated conversion it uses lives in k8s.io/kubernetes, which is not a
// library, so the eight parameters are read here.
func podLogOptions(q url.Values) (*corev1.PodLogOptions, error) {
	o := &corev1.PodLogOptions{Container: q.Get("container")}
	var err error
	flag := func(name string, to *bool) {
		if v := q.Get(name); v != "" && err == nil {
			*to, err = strconv.ParseBool(v)
		}
	}
	number := func(name string, to **int64) {
		if v := q.Get(name); v != "" && err == nil {
			var n int64
			if n, err = strconv.ParseInt(v, 10, 64); err == nil {
				*to = &n
			}
		}
	}
	flag("follow", &o.Follow)
	flag("previous", &o.Previous)
	flag("timestamps", &o.Timestamps)
	flag("insecureSkipTLSVerifyBackend", &o.InsecureSkipTLSVerifyBackend)
	number("sinceSeconds", &o.SinceSeconds)
	number("tailLines", &o.TailLines)
	number("limitBytes", &o.LimitBytes)
	if v := q.Get("sinceTime"); v != "" && err == nil {
		var t time.Time
		if t, err = time.Parse(time.RFC3339, v); err == nil {
			o.SinceTime = &metav1.Time{Time: t}
		}
	}
	if v := q.Get("stream"); v != "" {
		o.Stream = &v
	}
	return o, err
}

// flushWriter sends each write at once, as the kubelet's flushwriter does,
// so a follow streams.
type flushWriter struct{ w http.ResponseWriter }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if fl, ok := f.w.(http.Flusher); ok {
		fl.Flush()
	}
	return n, err
}

func hasContainer(pod *corev1.Pod, name string) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if c.Name == name {
				return true
			}
		}
	}
	return false
}

// containerLogID is the ID of the container instance whose log is asked
// for, or the kubelet's error when there is none to read: the rules of
// validateContainerLogStatus (k8s.io/kubernetes pkg/kubelet/kubelet_pods.go).
func containerLogID(pod *corev1.Pod, container string, previous bool) (string, error) {
	var st *corev1.ContainerStatus
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range list {
			if list[i].Name == container {
				st = &list[i]
			}
		}
	}
	if st == nil {
		return "", fmt.Errorf("container %q in pod %q is not available", container, pod.Name)
	}
	last := st.LastTerminationState.Terminated
	waiting, running, terminated := st.State.Waiting, st.State.Running, st.State.Terminated
	switch {
	case previous:
		if last == nil || last.ContainerID == "" {
			return "", fmt.Errorf("previous terminated container %q in pod %q not found", container, pod.Name)
		}
		return last.ContainerID, nil
	case running != nil:
		return st.ContainerID, nil
	case terminated != nil:
		switch {
		case terminated.ContainerID != "":
			return terminated.ContainerID, nil
		case last != nil && last.ContainerID != "":
			return last.ContainerID, nil
		}
		return "", fmt.Errorf("container %q in pod %q is terminated", container, pod.Name)
	case last != nil:
		if last.ContainerID == "" {
			return "", fmt.Errorf("container %q in pod %q is terminated", container, pod.Name)
		}
		return last.ContainerID, nil
	case waiting != nil:
		switch waiting.Reason {
		case "ErrImagePull":
			return "", fmt.Errorf("container %q in pod %q is waiting to start: image can't be pulled", container, pod.Name)
		case "ImagePullBackOff":
			return "", fmt.Errorf("container %q in pod %q is waiting to start: trying and failing to pull image", container, pod.Name)
		}
		return "", fmt.Errorf("container %q in pod %q is waiting to start: %v", container, pod.Name, waiting.Reason)
	}
	return "", fmt.Errorf("container %q in pod %q is waiting to start - no logs yet", container, pod.Name)
}
