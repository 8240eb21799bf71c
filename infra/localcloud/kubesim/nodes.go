package kubesim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
)

// Nodes in the simulator: the scheduler and GKE's node auto-provisioning,
// played together. A pod that asks for GPUs gets a node of its own, made for
// it with the labels its node selector asks for and those GKE gives every
// node (node pool, capacity tier, instance type, zone), as Autopilot makes a
// node for a pod that fills a GPU machine; the node goes once the pod is
// gone (GKE's autoscaler removes an empty node after about ten minutes;
// here at once, so nodes never pile up). Every other pod (the Ray head, the
// submitter) is placed on one general-purpose node. Each pod is bound
// through the Binding subresource, as kube-scheduler binds it. No
// scheduling predicate is checked beyond the node selector: the capacity
// a tier lacks is played by the Scenario (capacity.go).
//
// Every node's InternalIP is 127.0.0.1 and its kubelet port is the kubelet
// stand-in's (kubeletserver.go), so the API server reaches it there.

const (
	// zone is where the simulated nodes are (examples' region us-central1).
	zone = "us-central1-b"
	// cpuNode is the general-purpose node every pod without GPUs runs on.
	cpuNode = "gke-localcloud-default-pool-5d4c1f7a-0001"
	// kubeletVersion is what the nodes report: the API server's version, as
	// GKE names its builds.
	kubeletVersion = "v1.34.1-gke.1000"
	// podUIDAnnotation names, on a GPU node, the pod it was made for.
	podUIDAnnotation = "localcloud.raydrop.dev/pod-uid"
	// nodePeriod is how often nodes whose pod is gone are removed.
	nodePeriod = time.Second
)

// gpuMachines are the GKE machine families by accelerator, and the GPU counts
// their machine types come in
// (https://cloud.google.com/compute/docs/accelerator-optimized-machines,
// https://cloud.google.com/compute/docs/gpus). A pod gets the smallest type
// with as many GPUs as it asks for.
var gpuMachines = map[string]struct {
	family string
	counts []int
}{
	"nvidia-b200":           {"a4-highgpu-%dg", []int{8}},
	"nvidia-h200-141gb":     {"a3-ultragpu-%dg", []int{8}},
	"nvidia-h100-mega-80gb": {"a3-megagpu-%dg", []int{8}},
	"nvidia-h100-80gb":      {"a3-highgpu-%dg", []int{1, 2, 4, 8}},
	"nvidia-a100-80gb":      {"a2-ultragpu-%dg", []int{1, 2, 4, 8}},
	"nvidia-gb200":          {"a4x-highgpu-%dg", []int{4}},
	"nvidia-l4":             {"g2-standard-%d", []int{1, 2, 4, 8}},
}

// g2VCPUs is the G2 machine type's vCPUs by its L4 count: its name says
// vCPUs, not GPUs.
var g2VCPUs = map[int]int{1: 4, 2: 24, 4: 48, 8: 96}

// machineFor is the instance type and GPU count of the machine a pod asking
// for gpus accelerators of type accel gets.
func machineFor(accel string, gpus int) (string, int) {
	m, ok := gpuMachines[accel]
	if !ok {
		return "", gpus
	}
	n := m.counts[len(m.counts)-1]
	for _, c := range m.counts {
		if c >= gpus {
			n = c
			break
		}
	}
	n = max(n, gpus)
	if accel == "nvidia-l4" {
		return fmt.Sprintf(m.family, g2VCPUs[n]), n
	}
	return fmt.Sprintf(m.family, n), n
}

// provisioning is GKE's cloud.google.com/gke-provisioning node label for the
// capacity tier a node selector asks for.
func provisioning(sel map[string]string) string {
	switch TierOf(sel) {
	case spec.TierSpot:
		return "spot"
	case spec.TierFlexStart:
		return "flex-start"
	}
	return "standard"
}

// podGPUs is what a pod's containers ask for of nvidia.com/gpu.
func podGPUs(pod *corev1.Pod) int {
	n := 0
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
			n += int(q.Value())
		} else if q, ok := c.Resources.Requests["nvidia.com/gpu"]; ok {
			n += int(q.Value())
		}
	}
	return n
}

// nodes makes and removes the simulated nodes.
type nodes struct {
	client.Client
	port int32 // the kubelet stand-in's
	log  *slog.Logger

	cpuOnce sync.Once
	cpuErr  error
}

// nodeFor is the node pod goes to: the general-purpose one, or a GPU node
// made for it. It is created if it does not exist.
func (n *nodes) nodeFor(ctx context.Context, pod *corev1.Pod) (string, error) {
	gpus := podGPUs(pod)
	if gpus == 0 {
		n.cpuOnce.Do(func() { n.cpuErr = n.create(ctx, n.cpu()) })
		return cpuNode, n.cpuErr
	}
	node := n.gpu(pod, gpus)
	if err := n.create(ctx, node); err != nil {
		return "", err
	}
	return node.Name, nil
}

// create creates the node, with its status; one that exists is left as is.
func (n *nodes) create(ctx context.Context, node *corev1.Node) error {
	err := n.Create(ctx, node)
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("kubesim: create node %s: %w", node.Name, err)
	}
	n.log.Debug("node created", "node", node.Name, "instance_type", node.Labels[corev1.LabelInstanceTypeStable])
	return nil
}

// cpu is the general-purpose node.
func (n *nodes) cpu() *corev1.Node {
	labels := map[string]string{
		"cloud.google.com/gke-nodepool":     "default-pool",
		"cloud.google.com/gke-provisioning": "standard",
		corev1.LabelInstanceTypeStable:      "e2-standard-32",
	}
	return n.node(cpuNode, labels, nil, corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("128Gi"), corev1.ResourcePods: resource.MustParse("110"),
	}, nil)
}

// gpu is the node made for a pod asking for gpus GPUs: its node selector's
// labels, its tier's taint, its machine type's GPUs. Its name is the pod's
// UID's, so a second try makes the same node.
func (n *nodes) gpu(pod *corev1.Pod, gpus int) *corev1.Node {
	sel := pod.Spec.NodeSelector
	accel := sel[names.NodeAccelerator]
	machine, count := machineFor(accel, gpus)
	pool := "nap-" + strings.TrimPrefix(accel, "nvidia-")
	labels := maps.Clone(sel)
	if labels == nil {
		labels = map[string]string{}
	}
	labels["cloud.google.com/gke-nodepool"] = pool
	labels["cloud.google.com/gke-provisioning"] = provisioning(sel)
	if machine != "" {
		labels[corev1.LabelInstanceTypeStable] = machine
	}
	var taints []corev1.Taint
	// GKE taints every GPU node so only pods that ask for GPUs land there
	// (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus), and
	// Spot nodes for Spot pods.
	taints = append(taints, corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule})
	if TierOf(sel) == spec.TierSpot {
		taints = append(taints, corev1.Taint{Key: names.NodeSpot, Value: "true", Effect: corev1.TaintEffectNoSchedule})
	}
	sum := sha256.Sum256([]byte(pod.UID))
	name := fmt.Sprintf("gke-localcloud-%s-%s", pool, hex.EncodeToString(sum[:])[:8])
	return n.node(name, labels, taints, corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("224"), corev1.ResourceMemory: resource.MustParse("3968Gi"), corev1.ResourcePods: resource.MustParse("110"),
		"nvidia.com/gpu": resource.MustParse(strconv.Itoa(count)),
	}, map[string]string{podUIDAnnotation: string(pod.UID)})
}

// node is a Ready node with the labels every GKE node has, reached at
// 127.0.0.1 on the kubelet stand-in's port.
func (n *nodes) node(name string, labels map[string]string, taints []corev1.Taint, capacity corev1.ResourceList, annotations map[string]string) *corev1.Node {
	labels[corev1.LabelHostname] = name
	labels[corev1.LabelOSStable] = "linux"
	labels[corev1.LabelArchStable] = "amd64"
	labels[corev1.LabelTopologyZone] = zone
	labels[corev1.LabelTopologyRegion] = "us-central1"
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Spec:       corev1.NodeSpec{Taints: taints, ProviderID: "gce://localcloud/" + zone + "/" + name},
		Status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity,
			Phase: corev1.NodeRunning,
			Conditions: []corev1.NodeCondition{
				cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
				cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
				cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
				cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
			},
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}, {Type: corev1.NodeHostName, Address: name}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: n.port}},
			NodeInfo: corev1.NodeSystemInfo{
				KubeletVersion: kubeletVersion, ContainerRuntimeVersion: "containerd://1.7.27",
				OperatingSystem: "linux", Architecture: "amd64", OSImage: "Container-Optimized OS from Google",
			},
		},
	}
}

// bind assigns the pod to the node through the Binding subresource, as the
// scheduler does; the API server sets spec.nodeName and PodScheduled.
func (n *nodes) bind(ctx context.Context, pod *corev1.Pod, node string) error {
	b := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}
	if err := n.SubResource("binding").Create(ctx, pod, b); err != nil {
		return fmt.Errorf("kubesim: bind pod %s/%s to %s: %w", pod.Namespace, pod.Name, node, err)
	}
	return nil
}

// Start implements manager.Runnable: it removes the GPU nodes whose pod is
// gone.
func (n *nodes) Start(ctx context.Context) error {
	t := time.NewTicker(nodePeriod)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			n.sweep(ctx)
		}
	}
}

func (n *nodes) sweep(ctx context.Context) {
	list := &corev1.NodeList{}
	if err := n.List(ctx, list); err != nil {
		return
	}
	pods := &corev1.PodList{}
	if err := n.List(ctx, pods); err != nil {
		return
	}
	live := map[types.UID]bool{}
	for _, p := range pods.Items {
		live[p.UID] = true
	}
	for i := range list.Items {
		node := &list.Items[i]
		uid, ok := node.Annotations[podUIDAnnotation]
		if !ok || live[types.UID(uid)] {
			continue
		}
		if err := n.Delete(ctx, node); err == nil {
			n.log.Debug("node removed", "node", node.Name, "why", "its pod is gone")
		}
	}
}
