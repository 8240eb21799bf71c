package proof_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// unreadableOutput is a checkpoint bucket the deployment lets runs write,
// but whose reads Cloud Storage refuses to Monitor and Finalize: a role the
// deployment forgot.
const unreadableOutput = "raydrop-proof-unreadable"

// testPermissions: a run whose results the functions may not read (403 on
// its bucket) still ends, FAILED with reason CheckpointsUnreadable and one
// terminal event, and its cluster's workers go to zero.
func testPermissions(t *testing.T) {
	t.Parallel()
	scenario := "permissions: checkpoints the functions may not read"
	for _, fn := range []string{"Monitor", "Finalize"} {
		st.DenyBucket(fn, unreadableOutput)
		expectRefusals(func(r faults.Request) bool {
			return r.Client == fn && strings.Contains(r.Path, "/"+unreadableOutput)
		})
	}
	cluster := "unreadable"
	b, err := probe.Spec(example, cluster, unreadableOutput, nil)
	if err != nil {
		t.Fatal(err)
	}
	runID := upload(t, "unreadable", b, "")
	checkRun(t, scenario, runID, cluster, outcome{phase: runs.Failed})
	rec, err := probe.WaitPhase(context.Background(), st, runID, time.Second, probe.Ended...)
	if err == nil && rec.Reason != runs.CheckpointsUnreadable {
		msg := fmt.Sprintf("run %s ended %s with reason %s (%s), want CheckpointsUnreadable", runID, rec.Phase, rec.Reason, rec.Message)
		report.Add(scenario, 0, 0, msg)
		t.Error(msg)
	}
}

// refusals are the 403s scenarios provoke on purpose. auditRefusals fails
// on any other: nothing in the pipeline may need more than its grants.
var refusals struct {
	sync.Mutex
	expected []func(faults.Request) bool
}

func expectRefusals(f func(faults.Request) bool) {
	refusals.Lock()
	defer refusals.Unlock()
	refusals.expected = append(refusals.expected, f)
}

// auditRefusals goes through every request the functions made in the
// suite: each one refused (401 or 403) must be one a scenario provoked.
func auditRefusals(t *testing.T) {
	scenario := "permissions: the pipeline needs nothing outside its grants"
	refusals.Lock()
	defer refusals.Unlock()
	var problems []string
	total := 0
	for _, p := range []*faults.Proxy{st.KubeProxy, st.GCSProxy} {
		for _, r := range p.Requests() {
			total++
			if r.Status != http.StatusForbidden && r.Status != http.StatusUnauthorized {
				continue
			}
			if !slices.ContainsFunc(refusals.expected, func(f func(faults.Request) bool) bool { return f(r) }) {
				problems = append(problems, fmt.Sprintf("%s was refused %s %s (%d)", r.Client, r.Method, r.Path, r.Status))
			}
		}
	}
	for _, r := range st.PublishRefusals() {
		total++
		if !strings.Contains(r.Data, probeName) {
			problems = append(problems, fmt.Sprintf("%s was refused %s %s by Pub/Sub", r.Function, r.Method, r.Topic))
		}
	}
	report.Note(scenario, fmt.Sprintf("%d requests of the functions audited", total))
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("and %d more", len(problems)-10))
	}
	report.Add(scenario, 0, 0, problems...)
	for _, p := range problems {
		t.Error(p)
	}
}

// probeName marks the requests of testOutsideGrant.
const probeName = "outside-grant-probe"

// testOutsideGrant acts as each function's identity (through its own doors)
// outside its grants: every Kubernetes verb on every resource its Role does
// not name (Secrets and pods included) and any namespace but the runs',
// a publish to every topic it does not publish to, writes to the
// checkpoint buckets, reads of them by a function that does not read
// them, and a bucket outside the deployment. Each must be refused
// with a 403 (PermissionDenied for Pub/Sub), as Google Cloud refuses it.
func testOutsideGrant(t *testing.T) {
	t.Parallel()
	scenario := "permissions: a function acting outside its grant is refused"
	expectRefusals(func(r faults.Request) bool { return strings.Contains(r.Path, probeName) })
	ctx := context.Background()
	var problems []string
	probes := 0
	for _, fn := range wiring.Functions {
		kc, err := functionKube(fn.EntryPoint)
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{stack.Namespace, "kube-system"} {
			for _, res := range []string{wiring.ResourceConfigMaps, wiring.ResourceRayClusters, wiring.ResourceRayJobs, wiring.ResourceEvents, "secrets", "pods", wiring.ResourcePodLogs} {
				for _, verb := range []string{"get", "list", "create", "update", "delete"} {
					if ns == stack.Namespace && slices.Contains(fn.Kube[res], verb) {
						continue
					}
					if res == wiring.ResourcePodLogs && verb != "get" {
						continue // a pod's log is only read
					}
					probes++
					if err := kubeProbe(ctx, kc, ns, res, verb); !apierrors.IsForbidden(err) {
						problems = append(problems, fmt.Sprintf("%s %s %s in %s: %v, want 403 Forbidden", fn.Name, verb, res, ns, err))
					}
				}
			}
		}
		for _, key := range wiring.TopicKeys {
			if slices.Contains(fn.Publishes, key) {
				continue
			}
			probes++
			if err := publishProbe(ctx, fn.EntryPoint, stack.Topics.Name(key)); status.Code(err) != codes.PermissionDenied {
				problems = append(problems, fmt.Sprintf("%s publish to %s: %v, want PermissionDenied", fn.Name, key, err))
			}
		}
		probes++ // the publisher role allows nothing but publishing
		if err := getTopicProbe(ctx, fn.EntryPoint); status.Code(err) != codes.PermissionDenied {
			problems = append(problems, fmt.Sprintf("%s GetTopic: %v, want PermissionDenied", fn.Name, err))
		}
		// Cluster-scoped: nodes are only read, by those that keep the
		// evidence; nothing else.
		for _, verb := range []string{"get", "list", "create", "update", "delete"} {
			if slices.Contains(fn.KubeCluster[wiring.ResourceNodes], verb) {
				continue
			}
			probes++
			if err := clusterProbe(ctx, kc, wiring.ResourceNodes, verb); !apierrors.IsForbidden(err) {
				problems = append(problems, fmt.Sprintf("%s %s nodes: %v, want 403 Forbidden", fn.Name, verb, err))
			}
		}
		probes++ // RayJobs in every namespace at once: no ClusterRole
		if err := kc.RESTClient().Get().AbsPath("/apis/ray.io/v1/rayjobs").Param("labelSelector", probeName).Do(ctx).Error(); !apierrors.IsForbidden(err) {
			problems = append(problems, fmt.Sprintf("%s list rayjobs in all namespaces: %v, want 403 Forbidden", fn.Name, err))
		}
		door, err := st.GCSProxy.Door(fn.EntryPoint)
		if err != nil {
			t.Fatal(err)
		}
		gcs := []struct{ method, path string }{
			{http.MethodPost, "/upload/storage/v1/b/" + output + "/o?uploadType=media&name=" + probeName},
			{http.MethodDelete, "/storage/v1/b/" + output + "/o/" + probeName},
			{http.MethodGet, "/storage/v1/b/" + probeName + "-bucket/o"},
			// Writes to the intake bucket: only users drop objects there.
			{http.MethodPost, "/upload/storage/v1/b/" + stack.IntakeBucket + "/o?uploadType=media&name=" + probeName},
			// Bucket metadata: no role a function holds has storage.buckets.get.
			{http.MethodGet, "/storage/v1/b/" + stack.StateBucket + "?" + probeName},
		}
		if !fn.ReadsArtifacts {
			gcs = append(gcs, struct{ method, path string }{http.MethodGet, "/storage/v1/b/" + output + "/o?prefix=" + probeName})
		}
		if !fn.ReadsIntake() {
			gcs = append(gcs, struct{ method, path string }{http.MethodGet, "/storage/v1/b/" + stack.IntakeBucket + "/o?prefix=" + probeName})
		}
		for _, g := range gcs {
			probes++
			if code, err := httpStatus(ctx, g.method, "http://"+door+g.path); code != http.StatusForbidden {
				problems = append(problems, fmt.Sprintf("%s %s %s: %d %v, want 403", fn.Name, g.method, g.path, code, err))
			}
		}
	}
	report.Note(scenario, fmt.Sprintf("%d requests outside the functions' grants, each expected to be refused", probes))
	report.Add(scenario, 0, 0, problems...)
	for _, p := range problems {
		t.Error(p)
	}
}

// publishProbe publishes one message to topic as a function, through its
// Pub/Sub door.
func publishProbe(ctx context.Context, target, topic string) error {
	return asFunction(target, func(c pubsubpb.PublisherClient) error {
		_, err := c.Publish(ctx, &pubsubpb.PublishRequest{
			Topic: st.PubSub.TopicName(topic), Messages: []*pubsubpb.PubsubMessage{{Data: []byte(probeName)}},
		})
		return err
	})
}

// getTopicProbe asks Pub/Sub for a topic as a function, through its door.
func getTopicProbe(ctx context.Context, target string) error {
	return asFunction(target, func(c pubsubpb.PublisherClient) error {
		_, err := c.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: st.PubSub.TopicName(probeName)})
		return err
	})
}

// asFunction calls Pub/Sub through a function's door: as its identity.
func asFunction(target string, call func(pubsubpb.PublisherClient) error) error {
	door, err := st.PubSubDoor(target)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(door, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return call(pubsubpb.NewPublisherClient(conn))
}

// functionKube is a Kubernetes client through a function's door: its
// identity.
func functionKube(target string) (*kubernetes.Clientset, error) {
	door, err := st.KubeProxy.Door(target)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(&rest.Config{Host: "http://" + door})
}

// kubeProbe makes one request for verb on resource in namespace, on objects
// named probeName (the API server authorizes before it looks the object up
// or decodes it, so a refused verb is a 403 whatever the object).
func kubeProbe(ctx context.Context, kc *kubernetes.Clientset, namespace, resource, verb string) error {
	rc := kc.CoreV1().RESTClient()
	prefix := "/api/v1"
	if g := wiring.KubeGroups[resource]; g != "" {
		prefix = "/apis/" + g + "/v1"
	}
	resource, sub, _ := strings.Cut(resource, "/") // pods/log: /pods/<name>/log
	collection := []string{prefix, "namespaces", namespace, resource}
	if namespace == "" {
		collection = []string{prefix, resource} // cluster-scoped
	}
	object := append(slices.Clone(collection), probeName)
	if sub != "" {
		object = append(object, sub)
	}
	body := []byte(`{"metadata":{"name":"` + probeName + `"}}`)
	var req *rest.Request
	switch verb {
	case "get":
		req = rc.Get().AbsPath(object...)
	case "list":
		req = rc.Get().AbsPath(collection...).Param("labelSelector", probeName)
	case "create": // the field manager marks the collection's path
		req = rc.Post().AbsPath(collection...).Param("fieldManager", probeName).Body(body)
	case "update":
		req = rc.Put().AbsPath(object...).Body(body)
	case "delete":
		req = rc.Delete().AbsPath(object...)
	}
	return req.SetHeader("Content-Type", "application/json").Do(ctx).Error()
}

// clusterProbe is kubeProbe on a cluster-scoped resource.
func clusterProbe(ctx context.Context, kc *kubernetes.Clientset, resource, verb string) error {
	return kubeProbe(ctx, kc, "", resource, verb)
}

// httpStatus is the status of one request.
func httpStatus(ctx context.Context, method, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(""))
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// testGrantsPropagating starts a new Provision instance while its
// Kubernetes grant is missing (a fresh deployment whose IAM and RBAC
// changes have not reached the cluster yet), drops a job, and restores the
// grant once Provision was refused twice: the same instance then starts the
// run, which succeeds. No delivery is acknowledged while refused (none is
// dropped), and the instance is never replaced.
func testGrantsPropagating(t *testing.T) {
	scenario := "permissions: start-up while grants propagate, then recovery on the same instance"
	ctx := context.Background()
	const fn = "Provision"
	if err := st.Revoke(ctx, fn); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	if err := st.Kill(fn); err != nil {
		t.Fatal(err)
	}
	if err := st.Restart(ctx, fn); err != nil {
		t.Fatal(err)
	}
	pid, restarts := st.PID(fn), st.Restarts(fn)
	name := "propagating"
	runID := upload(t, name, spec(t, "propagating", nil), "")
	own(runID, scenario)
	key := "provision-intake|subject|objects/jobs/" + name + ".json"
	var problems []string
	failed := func() (n int) {
		deliveries.Lock()
		defer deliveries.Unlock()
		for _, d := range deliveries.by[key] {
			if d.Code < 200 || d.Code > 299 {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(90 * time.Second)
	for failed() < 2 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	deliveries.Lock()
	for _, d := range deliveries.by[key] {
		// Past StaleStep the sweep may start the run with Monitor's grants,
		// and a redelivery then rightly finds nothing left to do.
		if d.Code >= 200 && d.Code <= 299 && d.Start.Before(revoked.Add(runs.StaleStep)) {
			problems = append(problems, fmt.Sprintf("Provision acknowledged the job (%d) while its grant was missing: the event was dropped", d.Code))
		}
	}
	deliveries.Unlock()
	if n := failed(); n < 2 {
		problems = append(problems, fmt.Sprintf("Provision was refused %d times within 90 s, want 2", n))
	}
	if err := st.Grant(ctx, fn); err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	expectRefusals(func(r faults.Request) bool {
		return r.Client == fn && !r.At.Before(revoked) && r.At.Before(granted.Add(time.Second))
	})
	report.Note(scenario, fmt.Sprintf("grant missing for %.1f s; Provision refused %d deliveries", granted.Sub(revoked).Seconds(), failed()))
	checkRun(t, scenario, runID, "propagating", outcome{phase: runs.Succeeded})
	deliveries.Lock()
	all := deliveries.by[key]
	if len(all) == 0 || all[len(all)-1].Code < 200 || all[len(all)-1].Code > 299 {
		problems = append(problems, "Provision never acknowledged the job once its grant was back")
	}
	deliveries.Unlock()
	if st.PID(fn) != pid || st.Restarts(fn) != restarts {
		problems = append(problems, fmt.Sprintf("Provision's instance was replaced (pid %d -> %d): the same instance must recover", pid, st.PID(fn)))
	}
	report.Add(scenario, 0, 0, problems...)
	for _, p := range problems {
		t.Error(p)
	}
}
