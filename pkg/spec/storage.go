package spec

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// NodeClass is what GKE Autopilot allows a pod on the nodes of one GPU
// type: the most ephemeral storage it may request, with the node selector
// that puts that storage on local SSD where Autopilot offers it.
//
// Autopilot validates every pod's requests against the maxima of its
// compute class or hardware and rejects a pod that asks for more
// (https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-resource-requests,
// "Minimum and maximum resource requests"). It backs ephemeral storage
// with local SSD for GPU pods that select
// cloud.google.com/gke-ephemeral-storage-local-ssd: "true"
// (https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-local-ssd,
// https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-gpus),
// and on A3 and newer machines GKE sets up the local SSD for pods itself
// (https://cloud.google.com/kubernetes-engine/docs/how-to/cloud-storage-fuse-csi-driver-perf,
// "For A3+ VMs, GKE automatically sets up Local SSD").
//
// The maxima below are conservative figures, not copied from the pages
// above (which were not at hand when they were written): a local-SSD
// class allows at most what the machine's bundled local SSD holds, less a
// margin for the system (the machine series' local SSD sizes are in
// https://cloud.google.com/compute/docs/accelerator-optimized-machines:
// a4-highgpu-8g and a3-ultragpu-8g 12,000 GiB, a3-highgpu-8g and
// a3-megagpu-8g 6,000 GiB, a2-ultragpu-8g 3,000 GiB, g2-standard-96
// 1,500 GiB), and a boot-disk class BootDiskEphemeralGi. Check them
// against the resource-requests page before relying on a figure near one.
type NodeClass struct {
	// LocalSSD: the pods of this class may select
	// NodeEphemeralLocalSSD and get ephemeral storage on local SSD.
	LocalSSD bool
	// MaxEphemeralGi is the most ephemeral storage, in GiB, a pod may
	// request on such a node: on local SSD when LocalSSD, else on the
	// boot disk.
	MaxEphemeralGi int64
}

// NodeEphemeralLocalSSD is the node selector key of local-SSD-backed
// ephemeral storage on Autopilot.
const NodeEphemeralLocalSSD = "cloud.google.com/gke-ephemeral-storage-local-ssd"

// BootDiskEphemeralGi is the most ephemeral storage, in GiB, a pod may
// request where its ephemeral storage is on the boot disk: the general
// Autopilot maximum (an assumption for GPU classes without local SSD).
const BootDiskEphemeralGi = 122

// NodeClasses are the GPU node classes raydrop knows, by the
// cloud.google.com/gke-accelerator value of their nodes. A GPU type
// missing here gets no local-SSD selector and the boot disk's maximum.
var NodeClasses = map[string]NodeClass{
	"nvidia-b200":           {LocalSSD: true, MaxEphemeralGi: 10000}, // A4: 12,000 GiB local SSD
	"nvidia-h200-141gb":     {LocalSSD: true, MaxEphemeralGi: 10000}, // A3 Ultra: 12,000 GiB
	"nvidia-h100-mega-80gb": {LocalSSD: true, MaxEphemeralGi: 5000},  // A3 Mega: 6,000 GiB
	"nvidia-h100-80gb":      {LocalSSD: true, MaxEphemeralGi: 5000},  // A3 High: 6,000 GiB
	"nvidia-a100-80gb":      {LocalSSD: true, MaxEphemeralGi: 2500},  // A2 Ultra: 3,000 GiB
	"nvidia-l4":             {LocalSSD: true, MaxEphemeralGi: 1200},  // G2 (96 vCPU): 1,500 GiB
	// A4X (GB200) and G4 (RTX PRO 6000): no local-SSD selector assumed.
	"nvidia-gb200":        {MaxEphemeralGi: BootDiskEphemeralGi},
	"nvidia-rtx-pro-6000": {MaxEphemeralGi: BootDiskEphemeralGi},
}

// NodeClassOf is the node class of a GPU type: a known one, else one on
// the boot disk.
func NodeClassOf(accelerator string) NodeClass {
	if c, ok := NodeClasses[accelerator]; ok {
		return c
	}
	return NodeClass{MaxEphemeralGi: BootDiskEphemeralGi}
}

// modelParams are the parameter counts, in billions, of the models raydrop
// is tuned for: Gemma 3's sizes
// (https://huggingface.co/collections/google/gemma-3-release; the 4B,
// 12B and 27B include the 0.4B SigLIP vision tower).
var modelParams = map[string]float64{"1b": 1.0, "4b": 4.3, "12b": 12.2, "27b": 27.4}

// gemma3RE reads the size of a Gemma 3 model id; sizeRE any model id's
// "<n>b" size part, e.g. Llama-3.1-8B.
var (
	gemma3RE = regexp.MustCompile(`(?i)^google/gemma-3-([0-9]+b)(-|$)`)
	sizeRE   = regexp.MustCompile(`(?i)(?:^|[-_/.])([0-9]+(?:\.[0-9]+)?)b(?:[-_.]|$)`)
)

// UnknownModelParams is the parameter count, in billions, assumed of a
// model whose id says nothing of its size: larger than any Gemma 3.
const UnknownModelParams = 32

// ModelParams is the model's parameter count in billions: Gemma 3's from
// the table, another's from the size its id names, else
// UnknownModelParams.
func ModelParams(id string) float64 {
	if m := gemma3RE.FindStringSubmatch(id); m != nil {
		if p, ok := modelParams[strings.ToLower(m[1])]; ok {
			return p
		}
	}
	if m := sizeRE.FindStringSubmatch(id); m != nil {
		if p, err := strconv.ParseFloat(m[1], 64); err == nil && p > 0 {
			return p * 1.1 // a name rounds its size; vision towers and embeddings add some
		}
	}
	return UnknownModelParams
}

// The default scratch is sized as copies of the bf16 weights (2 bytes a
// parameter): the Hugging Face cache's download, the trainer's checkpoints
// (Ray Train keeps two on the node while one uploads; a checkpoint that
// saves full embeddings or merged weights approaches the weights' size),
// and the resume copy; then the headroom for the rest the worker writes on
// the node: the runtime env's packages (torch and CUDA libraries, about
// 10 GB unpacked), the datasets cache and Ray's logs.
const (
	scratchCopies     = 4
	scratchHeadroomGi = 64
)

// DefaultScratch is the scratch space a worker pod gets for the model when
// cluster.workers.scratch is empty, in whole GiB.
func DefaultScratch(modelID string) string {
	weightsGi := ModelParams(modelID) * 2e9 / (1 << 30)
	return strconv.FormatInt(int64(math.Ceil(scratchCopies*weightsGi))+scratchHeadroomGi, 10) + "Gi"
}

// WorkerScratch is the ephemeral storage of a worker pod:
// cluster.workers.scratch, or the model's DefaultScratch.
func (s *JobSpec) WorkerScratch() resource.Quantity {
	v := s.Cluster.Workers.Scratch
	if v == "" {
		v = DefaultScratch(s.Model.ID)
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return resource.MustParse(DefaultScratch(s.Model.ID)) // Validate reports the field
	}
	return q
}

// storageChecks: the workers' scratch fits what their node class allows.
func (s *JobSpec) storageChecks() Problems {
	w := s.Cluster.Workers
	if w.Scratch != "" && checkString(w.Scratch, rules{kind: "storage"}) != "" {
		return nil // the field's own check reports it
	}
	c := NodeClassOf(w.Accelerator)
	limit := resource.MustParse(strconv.FormatInt(c.MaxEphemeralGi, 10) + "Gi")
	scratch := s.WorkerScratch()
	if scratch.Cmp(limit) <= 0 {
		return nil
	}
	where := "ephemeral storage on the boot disk"
	if c.LocalSSD {
		where = "ephemeral storage on local SSD"
	}
	if w.Scratch == "" {
		return Problems{{Path: "cluster.workers.scratch", Message: fmt.Sprintf("is empty, and the default for %s, %s, is more than GKE Autopilot lets a pod on %s nodes request (%s) (allowed: a size up to %s, which the model may not fit)", s.Model.ID, scratch.String(), w.Accelerator, where, limit.String())}}
	}
	return Problems{{Path: "cluster.workers.scratch", Message: fmt.Sprintf("%s is more than GKE Autopilot lets a pod on %s nodes request (%s) (allowed: up to %s)", quote(w.Scratch), w.Accelerator, where, limit.String())}}
}
