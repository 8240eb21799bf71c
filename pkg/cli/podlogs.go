package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// podLogOptions is what `raydrop logs RUN --pod P` asks of the pod log
// endpoint.
type podLogOptions struct {
	pod, container, kubeconfig string
	previous, follow           bool
	tail                       int64 // -1: all
}

// runPodLogs prints a live pod's container log, read through the GKE API
// server (GET /api/v1/namespaces/N/pods/P/log, which the API server
// proxies to the kubelet of the pod's node): one of the run's Ray pods or
// its submitter. It reads what the pod still has, so only while the pod
// lives.
func runPodLogs(ctx context.Context, e *env, r *runs.Record, o podLogOptions) int {
	if r.Namespace == "" || r.Cluster == "" {
		return fail(e, "logs", fmt.Errorf("run %s (%s) has no cluster: it has no pods", r.RunID, r.Phase))
	}
	kube, err := kubeClient(o.kubeconfig)
	if err != nil {
		return fail(e, "logs", err)
	}
	pod, err := kube.CoreV1().Pods(r.Namespace).Get(ctx, o.pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && !ofRun(pod, r):
		return fail(e, "logs", fmt.Errorf("pod %s is not one of run %s's pods in namespace %s; %s", o.pod, r.RunID, r.Namespace, runPods(ctx, kube, r)))
	case err != nil:
		return fail(e, "logs", kubeError(err, r.Namespace))
	}
	opts := &corev1.PodLogOptions{Container: o.container, Previous: o.previous, Follow: o.follow}
	if o.tail >= 0 {
		opts.TailLines = &o.tail
	}
	stream, err := kube.CoreV1().Pods(r.Namespace).GetLogs(o.pod, opts).Stream(ctx)
	if err != nil {
		return fail(e, "logs", kubeError(err, r.Namespace))
	}
	defer func() { _ = stream.Close() }()
	if _, err := io.Copy(e.stdout, stream); err != nil && ctx.Err() == nil {
		return fail(e, "logs", fmt.Errorf("read the log of pod %s: %w", o.pod, err))
	}
	return ExitOK
}

// kubeClient reaches the API server the kubeconfig names (empty: $KUBECONFIG,
// then ~/.kube/config, as kubectl finds it).
func kubeClient(path string) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("no Kubernetes cluster to read pods from: %w (pass --kubeconfig or set KUBECONFIG; `gcloud container clusters get-credentials CLUSTER --location LOCATION` writes one)", err)
	}
	return kubernetes.NewForConfig(cfg)
}

// ofRun reports whether the pod belongs to the run: a Ray pod of its
// cluster, or the submitter of one of its attempts' RayJobs.
func ofRun(pod *corev1.Pod, r *runs.Record) bool {
	if pod.Labels[names.LabelRayCluster] == r.Cluster {
		return true
	}
	job := pod.Labels["batch.kubernetes.io/job-name"]
	for n := 1; n <= r.Attempt; n++ {
		if job == names.RayJob(r.RunID, n) {
			return true
		}
	}
	return false
}

// runPods says which of the run's pods exist now, for an error message.
func runPods(ctx context.Context, kube kubernetes.Interface, r *runs.Record) string {
	list, err := kube.CoreV1().Pods(r.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "its pods could not be listed: " + kubeError(err, r.Namespace).Error()
	}
	var pods []string
	for i := range list.Items {
		if ofRun(&list.Items[i], r) {
			pods = append(pods, list.Items[i].Name)
		}
	}
	if len(pods) == 0 {
		return "it has none now (its workers scale to zero when it ends; `raydrop logs " + r.RunID + "` prints the driver's log kept beside the run)"
	}
	slices.Sort(pods)
	return "its pods now: " + strings.Join(pods, ", ")
}

// kubeError says what a refused pod or log request means.
func kubeError(err error, ns string) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("not allowed to read pods or their logs in namespace %s (needs get on pods and pods/log): %w", ns, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("the cluster does not accept your credentials (run `gcloud container clusters get-credentials` again): %w", err)
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Message != "" {
		return errors.New(st.Status().Message)
	}
	return err
}
