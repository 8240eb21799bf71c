package kubesim

import (
	"context"
	"log/slog"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const gcPeriod = 500 * time.Millisecond

// collector is the garbage collector for what KubeRay creates: Pods and
// Services owned by a RayCluster, submitter Jobs and RayClusters owned by
// a RayJob, and the submitter Jobs' Pods; and, where Kueue runs
// (Options.Kueue), the Workloads it made for RayJobs (Kueue leaves a deleted job's Workload to
// the garbage collector, and its quota is held until the Workload goes).
// An object whose controlling owner no longer exists (or was replaced by
// one of the same name) is deleted in the background.
type collector struct {
	cache  client.Reader // candidates
	api    client.Reader // uncached: the owner's absence is confirmed here
	writer client.Writer
	log    *slog.Logger
	// workloads: Kueue runs, its Workloads are collected too.
	workloads bool
	// noWorkloadsUntil: the API server served no Workloads (Kueue's CRDs
	// not installed yet) when last asked; asked again after this.
	noWorkloadsUntil time.Time
}

// workloadList is Kueue's WorkloadList, read as unstructured: the
// simulator does not build against Kueue's module.
var workloadList = schema.GroupVersionKind{Group: "kueue.x-k8s.io", Version: "v1beta2", Kind: "WorkloadList"}

// Start implements manager.Runnable.
func (g *collector) Start(ctx context.Context) error {
	t := time.NewTicker(gcPeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			g.sweep(ctx)
		}
	}
}

func (g *collector) sweep(ctx context.Context) {
	lists := []client.ObjectList{&corev1.PodList{}, &corev1.ServiceList{}, &batchv1.JobList{}, &rayv1.RayClusterList{}}
	for _, l := range lists {
		if err := g.cache.List(ctx, l); err == nil {
			g.collect(ctx, l)
		}
	}
	// Workloads are few: listed from the API server, with no informer on a
	// CRD that may not be there.
	if !g.workloads || time.Now().Before(g.noWorkloadsUntil) {
		return
	}
	wl := &unstructured.UnstructuredList{}
	wl.SetGroupVersionKind(workloadList)
	switch err := g.api.List(ctx, wl); {
	case meta.IsNoMatchError(err):
		g.noWorkloadsUntil = time.Now().Add(time.Second)
	case err == nil:
		g.collect(ctx, wl)
	}
}

// collect deletes the objects of l whose controlling owner is gone.
func (g *collector) collect(ctx context.Context, l client.ObjectList) {
	items, err := meta.ExtractList(l)
	if err != nil {
		return
	}
	for _, it := range items {
		obj, ok := it.(client.Object)
		if !ok || obj.GetDeletionTimestamp() != nil {
			continue
		}
		ref := metav1.GetControllerOfNoCopy(obj)
		if ref == nil || ownerKind(ref) == nil {
			continue
		}
		if g.ownerExists(ctx, obj.GetNamespace(), ref) {
			continue
		}
		err := g.writer.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground),
			client.Preconditions{UID: ptrUID(obj.GetUID())})
		if err == nil {
			g.log.Debug("garbage collected", "kind", kindOf(obj), "namespace", obj.GetNamespace(), "name", obj.GetName(), "owner", ref.Kind+"/"+ref.Name)
		}
	}
}

// ownerExists looks in the cache first; an owner missing there is looked
// up in the API server before its objects go.
func (g *collector) ownerExists(ctx context.Context, ns string, ref *metav1.OwnerReference) bool {
	for _, r := range []client.Reader{g.cache, g.api} {
		owner := ownerKind(ref)
		err := r.Get(ctx, types.NamespacedName{Namespace: ns, Name: ref.Name}, owner)
		switch {
		case err == nil && owner.GetUID() == ref.UID:
			return true
		case err != nil && !apierrors.IsNotFound(err):
			return true // unknown: keep
		}
	}
	return false
}

// ownerKind is an empty object of the owner's kind, for the kinds whose
// dependents are collected; nil for others.
func ownerKind(ref *metav1.OwnerReference) client.Object {
	switch {
	case ref.APIVersion == rayv1.GroupVersion.String() && ref.Kind == "RayCluster":
		return &rayv1.RayCluster{}
	case ref.APIVersion == rayv1.GroupVersion.String() && ref.Kind == "RayJob":
		return &rayv1.RayJob{}
	case ref.APIVersion == batchv1.SchemeGroupVersion.String() && ref.Kind == "Job":
		return &batchv1.Job{}
	}
	return nil
}

func ptrUID(u types.UID) *types.UID { return &u }

func kindOf(o client.Object) string {
	switch o.(type) {
	case *corev1.Pod:
		return "Pod"
	case *corev1.Service:
		return "Service"
	case *batchv1.Job:
		return "Job"
	case *rayv1.RayCluster:
		return "RayCluster"
	case *unstructured.Unstructured:
		return o.GetObjectKind().GroupVersionKind().Kind
	}
	return "object"
}
