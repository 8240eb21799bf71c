package stack

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/raydrop/raydrop/pkg/wiring"
)

// The local cloud holds each function to what its identity may do, from
// the same table the deployment grants (wiring.Functions):
//
//   - Kubernetes: each function authenticates to the API server (RBAC on)
//     as its own user, named as GKE names its Google service account, and
//     holds only the Role the deployment binds to it in the runs'
//     namespace. A verb it has no grant for is refused with the API
//     server's own 403.
//   - Cloud Storage: a function may read and write the state bucket, read
//     the intake bucket if its objects trigger it, read the checkpoint
//     buckets if the table says it reads them, and nothing else; any other request gets the 403 Cloud Storage sends an identity
//     without the role.
//   - Pub/Sub: each function reaches the emulator through its own door,
//     which refuses a publish to a topic it has no publisher role on, with
//     Pub/Sub's PERMISSION_DENIED (pubsubdoor.go).

// Namespace is the local deployment's only namespace for runs.
const Namespace = "default"

// functionOf is the wiring table's function of an entry point.
func functionOf(target string) wiring.Function {
	for _, f := range wiring.Functions {
		if f.EntryPoint == target {
			return f
		}
	}
	panic("no function with entry point " + target)
}

// Identity is the user a function (an entry point) authenticates as.
func Identity(target string) string { return functionOf(target).Identity(Project) }

// admin is a Kubernetes client with the cluster admin's credentials.
func (s *Stack) admin() (*kubernetes.Clientset, error) { return kubernetes.NewForConfig(s.Sim.Config) }

// grantAll applies every function's Role and RoleBinding, as the
// deployment's HCL does.
func (s *Stack) grantAll(ctx context.Context) error {
	kc, err := s.admin()
	if err != nil {
		return err
	}
	for _, f := range wiring.Functions {
		if _, err := kc.RbacV1().Roles(Namespace).Create(ctx, f.Role(Namespace), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create role of %s: %w", f.Name, err)
		}
		if cr := f.ClusterRole(); cr != nil {
			if _, err := kc.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("create cluster role of %s: %w", f.Name, err)
			}
		}
		if err := s.Grant(ctx, f.EntryPoint); err != nil {
			return err
		}
	}
	return nil
}

// Grant binds a function's Role (and ClusterRole) to its identity (again).
func (s *Stack) Grant(ctx context.Context, target string) error {
	f := functionOf(target)
	kc, err := s.admin()
	if err != nil {
		return err
	}
	_, err = kc.RbacV1().RoleBindings(Namespace).Create(ctx, f.RoleBinding(Namespace, f.Identity(Project)), metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("bind role of %s: %w", f.Name, err)
	}
	if b := f.ClusterRoleBinding(f.Identity(Project)); b != nil {
		if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("bind cluster role of %s: %w", f.Name, err)
		}
	}
	return nil
}

// Revoke removes a function's RoleBinding (and ClusterRoleBinding): the
// state right after a deployment whose grants have not reached the
// cluster yet.
func (s *Stack) Revoke(ctx context.Context, target string) error {
	kc, err := s.admin()
	if err != nil {
		return err
	}
	err = kc.RbacV1().RoleBindings(Namespace).Delete(ctx, "raydrop-"+functionOf(target).Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("unbind role of %s: %w", target, err)
	}
	if functionOf(target).ClusterRole() != nil {
		err = kc.RbacV1().ClusterRoleBindings().Delete(ctx, "raydrop-"+functionOf(target).Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("unbind cluster role of %s: %w", target, err)
		}
	}
	return nil
}

// kubeTransport is a function's own credentials to the API server.
func (s *Stack) kubeTransport(target string) (http.RoundTripper, error) {
	cfg, err := s.Sim.User(Identity(target))
	if err != nil {
		return nil, err
	}
	return rest.TransportFor(cfg)
}

// holdToGrants makes Cloud Storage refuse a function what its identity has
// no role for.
func (s *Stack) holdToGrants(target string) {
	f := functionOf(target)
	s.GCSProxy.Refuse(target, func(method, path string) (int, string) {
		bucket := bucketOf(path)
		read := method == http.MethodGet || method == http.MethodHead
		perm := permission(method, path)
		switch {
		case strings.HasPrefix(perm, "storage.buckets."), strings.Contains(path, "/copyTo/"), strings.Contains(path, "/rewriteTo/"):
			// No role a function holds has a bucket permission, and none
			// copies (a copy needs the destination's role too).
			return http.StatusForbidden, forbidden(target, perm)
		case bucket == StateBucket: // roles/storage.objectAdmin
			return 0, ""
		case read && f.ReadsIntake() && bucket == IntakeBucket: // roles/storage.objectViewer
			return 0, ""
		case read && f.ReadsArtifacts && slices.Contains(s.opts.OutputBuckets, bucket): // roles/storage.objectViewer
			return 0, ""
		case f.WritesReports && perm == "storage.objects.create" && slices.Contains(s.opts.OutputBuckets, bucket) && createsOnly(path): // roles/storage.objectCreator
			return 0, ""
		}
		return http.StatusForbidden, forbidden(target, perm)
	})
}

// createsOnly reports whether an upload can only create an object:
// objectCreator lacks storage.objects.delete, which replacing an existing
// object needs, so Cloud Storage refuses it an upload over an existing
// name. This proxy cannot see whether the name exists, so it refuses every
// upload that could replace one: only ifGenerationMatch=0 passes.
// https://cloud.google.com/storage/docs/access-control/iam-permissions#object_permissions
func createsOnly(path string) bool {
	_, query, _ := strings.Cut(path, "?")
	q, err := url.ParseQuery(query)
	return err == nil && q.Get("ifGenerationMatch") == "0"
}

// DenyBucket makes Cloud Storage refuse every request of function (an
// entry point) for bucket: a role the deployment forgot.
func (s *Stack) DenyBucket(function, bucket string) {
	s.GCSProxy.Refuse(function, func(method, path string) (int, string) {
		if bucketOf(path) != bucket {
			return 0, ""
		}
		return http.StatusForbidden, forbidden(function, permission(method, path))
	})
}

// forbidden is the error body of Cloud Storage's JSON API for a missing
// permission:
// https://cloud.google.com/storage/docs/json_api/v1/status-codes#403_Forbidden
func forbidden(target, perm string) string { return forbiddenFor(Identity(target), perm) }

// forbiddenFor is that body for any identity.
func forbiddenFor(identity, perm string) string {
	return fmt.Sprintf(`{"error":{"code":403,"message":"%s does not have %s access to the Google Cloud Storage object. Permission '%s' denied on resource (or it may not exist).","errors":[{"message":"denied","domain":"global","reason":"forbidden"}]}}`,
		identity, perm, perm)
}

// bucketOf is the bucket a Cloud Storage request names: JSON API paths
// (/storage/v1/b/B..., /upload/storage/v1/b/B..., /download/storage/v1/b/B...)
// or an XML API path (/B/object). "" for a request that names none.
func bucketOf(path string) string {
	path, _, _ = strings.Cut(path, "?")
	for _, prefix := range []string{"/upload", "/download"} {
		path = strings.TrimPrefix(path, prefix)
	}
	if rest, ok := strings.CutPrefix(path, "/storage/v1/"); ok {
		rest, ok = strings.CutPrefix(rest, "b/")
		if !ok {
			return ""
		}
		bucket, _, _ := strings.Cut(rest, "/")
		return bucket
	}
	bucket, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	return bucket
}

// permission is the Cloud Storage permission a request needs.
func permission(method, path string) string {
	path, _, _ = strings.Cut(path, "?")
	if rest, ok := strings.CutPrefix(path, "/storage/v1/b/"); ok && !strings.Contains(rest, "/o") {
		// The bucket itself: its metadata, IAM policy or ACLs.
		switch method {
		case http.MethodGet, http.MethodHead:
			return "storage.buckets.get"
		case http.MethodDelete:
			return "storage.buckets.delete"
		}
		return "storage.buckets.update"
	}
	switch {
	case method == http.MethodPost || method == http.MethodPut:
		return "storage.objects.create"
	case method == http.MethodDelete:
		return "storage.objects.delete"
	case method == http.MethodPatch:
		return "storage.objects.update"
	case strings.HasSuffix(path, "/o"):
		return "storage.objects.list"
	}
	return "storage.objects.get"
}
