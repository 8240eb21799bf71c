package pipeline

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/util/retry"

	"github.com/raydrop/raydrop/pkg/names"
)

// kubeErr marks what the API server refused for good (an invalid object,
// a bad request) as permanent; the rest is worth a redelivery. Forbidden
// is not permanent: admission keeps runs to the namespaces where the
// functions hold their Roles, so a 403 means a grant that has not reached
// the cluster yet (IAM changes take minutes to propagate:
// https://cloud.google.com/iam/docs/access-change-propagation) or a
// deployment being repaired. Redelivery, bounded by the dead-letter
// policy, carries the event over it instead of dropping it.
func kubeErr(what string, err error) error {
	if err == nil {
		return nil
	}
	err = fmt.Errorf("%s: %w", what, err)
	if apierrors.IsInvalid(err) || apierrors.IsBadRequest(err) {
		return Permanent(err)
	}
	return err
}

// EnsureConfigMap creates the ConfigMap unless it exists. Its name carries
// its content hash, so an existing one is the same.
func (d *Deps) EnsureConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	_, err := d.Kube.ConfigMaps(cm.Namespace).Create(ctx, cm, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return kubeErr("create configmap "+cm.Namespace+"/"+cm.Name, err)
}

// EnsureCluster creates the RayCluster, or scales an existing one's worker
// groups back up to the desired replicas and minimum.
func (d *Deps) EnsureCluster(ctx context.Context, want *rayv1.RayCluster) error {
	rcs := d.Ray.RayV1().RayClusters(want.Namespace)
	_, err := rcs.Create(ctx, want, metav1.CreateOptions{})
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return kubeErr("create raycluster "+want.Namespace+"/"+want.Name, err)
	}
	_, err = d.editCluster(ctx, want.Namespace, want.Name, func(cur *rayv1.RayCluster) (bool, error) {
		// The attempt's first capacity tier, for the pods KubeRay creates
		// from now on (running ones stay on their nodes). An earlier
		// attempt's workersToDelete goes: KubeRay deletes the pods it names
		// on every reconcile and never clears the list in the spec.
		changed := place(cur, want, nil)
		for i := range cur.Spec.WorkerGroupSpecs {
			g := &cur.Spec.WorkerGroupSpecs[i]
			if len(g.ScaleStrategy.WorkersToDelete) > 0 {
				g.ScaleStrategy.WorkersToDelete = nil
				changed = true
			}
			for _, w := range want.Spec.WorkerGroupSpecs {
				if w.GroupName != g.GroupName {
					continue
				}
				if !equal(g.Replicas, w.Replicas) || !equal(g.MinReplicas, w.MinReplicas) {
					g.Replicas, g.MinReplicas = w.Replicas, w.MinReplicas
					changed = true
				}
			}
		}
		return changed, nil
	})
	return kubeErr("scale up raycluster "+want.Namespace+"/"+want.Name, err)
}

// editCluster reads the RayCluster, lets edit change it and writes it back
// when edit reports a change, again from a fresh read on a conflict.
func (d *Deps) editCluster(ctx context.Context, namespace, name string, edit func(*rayv1.RayCluster) (bool, error)) (changed bool, err error) {
	rcs := d.Ray.RayV1().RayClusters(namespace)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := rcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if changed, err = edit(cur); err != nil || !changed {
			return err
		}
		_, err = rcs.Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	return changed, err
}

// WorkerPods lists the worker pods of a RayCluster, or of every RayCluster
// in the namespace when cluster is "": KubeRay labels them
// ray.io/cluster=<name> and ray.io/node-type=worker.
func (d *Deps) WorkerPods(ctx context.Context, namespace, cluster string) ([]corev1.Pod, error) {
	sel := labels.Set{names.LabelRayNodeType: string(rayv1.WorkerNode)}
	if cluster != "" {
		sel[names.LabelRayCluster] = cluster
	}
	list, err := d.Kube.Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return nil, kubeErr("list worker pods in "+namespace+" ("+sel.String()+")", err)
	}
	return list.Items, nil
}

// ClusterEvents lists the Events of one reason recorded on a RayCluster,
// or on every RayCluster in the namespace when cluster is "" (one LIST,
// filtered by the API server on the Event's fields).
func (d *Deps) ClusterEvents(ctx context.Context, namespace, cluster, reason string) ([]corev1.Event, error) {
	sel := fields.Set{"involvedObject.kind": "RayCluster", "reason": reason}
	if cluster != "" {
		sel["involvedObject.name"] = cluster
	}
	list, err := d.Kube.Events(namespace).List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		return nil, kubeErr("list events in "+namespace+" ("+sel.String()+")", err)
	}
	return list.Items, nil
}

// PlaceWorkers puts the cluster's worker group on the placement of want (a
// capacity tier's node selector and tolerations) and names the pods of
// pending that are still pending in KubeRay's scaleStrategy.workersToDelete:
// KubeRay deletes those pods, whatever the autoscaler says, and creates
// their replacements from the new template. Pods already running stay
// where they are. A cluster already so placed is left alone.
//
// The pods are read again just before each write (the caller's list may be
// a tick old), so a pod that started meanwhile is not deleted; the window
// left is that one read. The list replaces the one before: KubeRay deletes
// what it names on every reconcile and never writes it back
// (raycluster_controller.go, reconcilePods), so names left there would
// carry over to later tiers, attempts and runs.
func (d *Deps) PlaceWorkers(ctx context.Context, want *rayv1.RayCluster, pending []string) error {
	_, err := d.editCluster(ctx, want.Namespace, want.Name, func(cur *rayv1.RayCluster) (bool, error) {
		pods, err := d.WorkerPods(ctx, want.Namespace, want.Name)
		if err != nil {
			return false, err
		}
		return place(cur, want, StillPending(pods, pending)), nil
	})
	return kubeErr("move the workers of raycluster "+want.Namespace+"/"+want.Name, err)
}

// StillPending is the pods of names that pods shows pending and not being
// deleted, in the order of names.
func StillPending(pods []corev1.Pod, names []string) []string {
	pending := map[string]bool{}
	for _, p := range pods {
		if p.Status.Phase == corev1.PodPending && p.DeletionTimestamp == nil {
			pending[p.Name] = true
		}
	}
	var out []string
	for _, n := range names {
		if pending[n] {
			out = append(out, n)
		}
	}
	return out
}

// place copies want's worker placement into cur, naming pending (and only
// those) for deletion; false when nothing changes.
func place(cur, want *rayv1.RayCluster, pending []string) bool {
	changed := false
	for i := range cur.Spec.WorkerGroupSpecs {
		g := &cur.Spec.WorkerGroupSpecs[i]
		for _, w := range want.Spec.WorkerGroupSpecs {
			ps, ws := &g.Template.Spec, w.Template.Spec
			if w.GroupName != g.GroupName || maps.Equal(ps.NodeSelector, ws.NodeSelector) && reflect.DeepEqual(ps.Tolerations, ws.Tolerations) {
				continue
			}
			ps.NodeSelector, ps.Tolerations = ws.NodeSelector, ws.Tolerations
			g.ScaleStrategy.WorkersToDelete = slices.Clone(pending)
			changed = true
		}
	}
	return changed
}

func equal(a, b *int32) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// ScaleToZero sets replicas and minReplicas of every worker group to 0
// (KubeRay would clamp replicas up to minReplicas otherwise). A cluster that
// is gone needs nothing.
func (d *Deps) ScaleToZero(ctx context.Context, namespace, name string) (changed bool, err error) {
	changed, err = d.editCluster(ctx, namespace, name, func(cur *rayv1.RayCluster) (bool, error) {
		zero := int32(0)
		changed := false
		for i := range cur.Spec.WorkerGroupSpecs {
			g := &cur.Spec.WorkerGroupSpecs[i]
			if !equal(g.Replicas, &zero) || !equal(g.MinReplicas, &zero) {
				g.Replicas, g.MinReplicas = &zero, &zero
				changed = true
			}
		}
		return changed, nil
	})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return changed && err == nil, kubeErr("scale raycluster "+namespace+"/"+name+" to zero", err)
}

// HasWorkers reports whether a cluster's spec asks for any worker.
func HasWorkers(rc *rayv1.RayCluster) bool {
	for _, g := range rc.Spec.WorkerGroupSpecs {
		if g.Replicas != nil && *g.Replicas > 0 || g.MinReplicas != nil && *g.MinReplicas > 0 {
			return true
		}
	}
	return false
}

// CreateRayJob creates the RayJob unless it exists.
func (d *Deps) CreateRayJob(ctx context.Context, job *rayv1.RayJob) error {
	_, err := d.Ray.RayV1().RayJobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return kubeErr("create rayjob "+job.Namespace+"/"+job.Name, err)
}

// DeleteRayJob deletes a RayJob; KubeRay's finalizer stops its Ray job.
func (d *Deps) DeleteRayJob(ctx context.Context, namespace, name string) error {
	err := d.Ray.RayV1().RayJobs(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return kubeErr("delete rayjob "+namespace+"/"+name, err)
}

// HeadPod is the name of a RayCluster's live head pod (KubeRay labels it
// ray.io/cluster=<name> and ray.io/node-type=head); "" when there is none.
func (d *Deps) HeadPod(ctx context.Context, namespace, cluster string) (string, error) {
	sel := labels.Set{names.LabelRayNodeType: string(rayv1.HeadNode), names.LabelRayCluster: cluster}
	list, err := d.Kube.Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return "", kubeErr("list the head pod in "+namespace+" ("+sel.String()+")", err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			return p.Name, nil
		}
	}
	return "", nil
}

// DeletePod deletes a pod; one already gone is no error.
func (d *Deps) DeletePod(ctx context.Context, namespace, name string) error {
	err := d.Kube.Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return kubeErr("delete pod "+namespace+"/"+name, err)
}
