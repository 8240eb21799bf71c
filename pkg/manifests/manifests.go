// Package manifests builds the Kubernetes objects of a run from a validated
// job spec: the ConfigMap that carries the trainer code, the RayCluster and
// the RayJob. The builders are pure: no I/O, the same input gives the same
// objects byte for byte.
package manifests

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/weights"
	"github.com/raydrop/raydrop/trainer"
)

// Fixed paths inside the Ray pods.
const (
	CodeMountPath  = "/code/"
	ScriptPath     = "/code/train.py"
	CheckPath      = "/code/datacheck.py"
	codeVolume     = "job-code"
	scratchVolume  = "local-storage"
	rayLogsVolume  = "ray-logs"
	rayLogsPath    = "/tmp/ray"
	scratchPath    = "/mnt/local-ssd/"
	headContainer  = "ray-head"
	workerContaine = "ray-worker"
	hfTokenEnv     = "HF_TOKEN"
	scratchEnv     = "RAYDROP_SCRATCH" // the trainer's folder for node-local copies (resume checkpoints)
)

// Run is the identity of one attempt of a run.
type Run struct {
	ID         string // run ID (names.RunIDFrom…)
	Attempt    int    // 1-based
	ResumeFrom string // checkpoint URI to resume from, or ""
	Source     string // where the spec came from, e.g. gs://bucket/jobs/x.json#123
	SpecHash   string
	Tier       int // the capacity tier the workers are asked on (an index into the spec's Tiers)
	// DatasetRevision, when set, is the Hub commit the data check read:
	// training reads it rather than the spec's revision, which may have
	// moved since.
	DatasetRevision string
	// Preinstalled: the head and the workers run the deployment's trainer
	// image, which holds the trainer's locked dependencies, so the runtime
	// env installs nothing (runs.Record.TrainerImage).
	Preinstalled bool
	// Model, when set, is the staged base model the workers read
	// (runs.Record.Model): its folder, its commit, and whether this run
	// copies it from the Hub first.
	Model *runs.Model
}

// checkpointURIRE allows the checkpoint URIs Ray Train writes, and nothing a
// shell treats specially.
var checkpointURIRE = regexp.MustCompile(`^gs://[a-z0-9][a-z0-9._-]*[a-z0-9](/[A-Za-z0-9_.:=-]+)+$`)

// Validate checks a run identity before it reaches a RayJob: the run ID and
// the resume URI end up on the trainer's command line.
func (r Run) Validate() error {
	if msg := spec.CheckRunID(r.ID); msg != "" {
		return fmt.Errorf("run id %s", msg)
	}
	if r.DatasetRevision != "" {
		if msg := spec.CheckRevision(r.DatasetRevision); msg != "" {
			return fmt.Errorf("dataset revision %s", msg)
		}
	}
	if m := r.Model; m != nil {
		if !weights.CommitRe.MatchString(m.Commit) || !checkpointURIRE.MatchString(m.URI) || strings.Contains(m.URI, "/../") {
			return fmt.Errorf("staged model %q at commit %q is not a gs:// folder and a Hub commit", m.URI, m.Commit)
		}
	}
	if r.Attempt < 1 {
		return fmt.Errorf("attempt %d is out of range (allowed: 1 or more)", r.Attempt)
	}
	if r.ResumeFrom != "" && (!checkpointURIRE.MatchString(r.ResumeFrom) || strings.Contains(r.ResumeFrom, "/../") || strings.HasSuffix(r.ResumeFrom, "/..")) {
		return fmt.Errorf("resume URI %q is not a gs:// checkpoint URI (allowed: gs://bucket/path of letters, digits, '_', '.', ':', '=' and '-')", r.ResumeFrom)
	}
	return nil
}

// Code is the trainer code as shipped to the cluster: the files and the hash
// of their content.
type Code struct {
	Files map[string]string
	Hash  string
}

// TrainerCode reads the embedded trainer files. The Python modules and
// their defaults travel; requirements reach the job through its runtime env.
func TrainerCode() (Code, error) {
	paths, err := fs.Glob(trainer.Files, "*.py")
	if err != nil {
		return Code{}, fmt.Errorf("list trainer files: %w", err)
	}
	paths = append(paths, trainer.DefaultsFile)
	sort.Strings(paths)
	c := Code{Files: map[string]string{}}
	h := sha256.New()
	for _, p := range paths {
		b, err := fs.ReadFile(trainer.Files, p)
		if err != nil {
			return Code{}, fmt.Errorf("read trainer file %s: %w", p, err)
		}
		c.Files[p] = string(b)
		fmt.Fprintf(h, "%s\x00%d\x00", p, len(b))
		h.Write(b)
	}
	c.Hash = hex.EncodeToString(h.Sum(nil))
	return c, nil
}

// TrainerConfigMap is the ConfigMap holding the trainer code, named by its
// content hash so that new code never replaces the code of a running job.
func TrainerConfigMap(s *spec.JobSpec, code Code) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        names.TrainerConfigMap(code.Hash),
			Namespace:   s.Cluster.Namespace,
			Labels:      map[string]string{names.LabelManagedBy: names.ManagedBy, names.LabelComponent: "trainer"},
			Annotations: map[string]string{names.AnnotCodeHash: code.Hash},
		},
		Data: code.Files,
	}
}

// RayCluster is the spec's cluster: a CPU head and one GPU worker group on
// capacity tier tier (an index into s.Tiers()), with the trainer code
// mounted at /code/.
func RayCluster(s *spec.JobSpec, code Code, tier int) *rayv1.RayCluster {
	c := s.Cluster
	cm := names.TrainerConfigMap(code.Hash)
	head := corev1.Container{
		Name:  headContainer,
		Image: c.HeadImage(),
		Ports: []corev1.ContainerPort{
			{ContainerPort: 6379, Name: "gcs"},
			{ContainerPort: 8265, Name: "dashboard"},
			{ContainerPort: 10001, Name: "client"},
		},
		Resources:    sameLimits(corev1.ResourceList{corev1.ResourceCPU: q(c.Head.CPU), corev1.ResourceEphemeralStorage: q(c.Head.EphemeralStorage), corev1.ResourceMemory: q(c.Head.Memory)}),
		Env:          podEnv(s),
		VolumeMounts: mounts(),
	}
	scratch := s.WorkerScratch()
	worker := corev1.Container{
		Name:  workerContaine,
		Image: c.WorkerImage(),
		// The scratch size is the container's ephemeral storage request and
		// limit: Autopilot gives a container that requests none 1 GiB
		// (https://cloud.google.com/kubernetes-engine/docs/concepts/autopilot-resource-requests,
		// "Default resource requests"), far less than the model's weights,
		// and evicts a pod that writes more than it asked for.
		Resources: sameLimits(corev1.ResourceList{
			"nvidia.com/gpu":                q(strconv.Itoa(c.Workers.GPUs)),
			corev1.ResourceCPU:              q(c.Workers.CPU),
			corev1.ResourceEphemeralStorage: scratch,
			corev1.ResourceMemory:           q(c.Workers.Memory),
		}),
		Env:          podEnv(s),
		VolumeMounts: mounts(),
		Lifecycle:    &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: PreStop}}},
	}
	if c.Ptrace {
		// py-spy reads the training processes' memory: the heartbeat adds its
		// native frames to a stalled rank's stacks (trainer/heartbeat.py).
		worker.SecurityContext = &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_PTRACE"}}}
		worker.Env = append(worker.Env, corev1.EnvVar{Name: PySpyEnv, Value: "1"})
	}
	sidecars := func(image string) []corev1.Container { return []corev1.Container{RayLogsSidecar(image)} }
	nodeSelector, tolerations := WorkerPlacement(s, tier)
	return &rayv1.RayCluster{
		TypeMeta: metav1.TypeMeta{APIVersion: rayv1.GroupVersion.String(), Kind: "RayCluster"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        c.Name,
			Namespace:   c.Namespace,
			Labels:      map[string]string{names.LabelManagedBy: names.ManagedBy, names.LabelComponent: "cluster"},
			Annotations: map[string]string{names.AnnotCodeHash: code.Hash},
		},
		Spec: rayv1.RayClusterSpec{
			RayVersion: c.RayVersion,
			HeadGroupSpec: rayv1.HeadGroupSpec{
				RayStartParams: map[string]string{"dashboard-host": "0.0.0.0"},
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					ServiceAccountName: c.ServiceAccount,
					InitContainers:     sidecars(c.HeadImage()),
					Containers:         []corev1.Container{head},
					Volumes:            volumes(cm, nil),
				}},
			},
			WorkerGroupSpecs: []rayv1.WorkerGroupSpec{{
				GroupName:      c.Workers.GroupName,
				Replicas:       ptr(int32(c.Workers.Replicas)),
				MinReplicas:    ptr(int32(c.Workers.MinReplicas)),
				MaxReplicas:    ptr(int32(c.Workers.MaxReplicas)),
				RayStartParams: map[string]string{},
				Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
					ServiceAccountName: c.ServiceAccount,
					InitContainers:     sidecars(c.WorkerImage()),
					Containers:         []corev1.Container{worker},
					Volumes:            volumes(cm, &scratch),
					NodeSelector:       nodeSelector,
					Tolerations:        tolerations,
				}},
			}},
		},
	}
}

// RayLogsContainer is the Ray pods' log collector: trainer/raylogs.py run
// as a native sidecar (an init container that restarts Always, Kubernetes
// 1.29 and later, so GKE stops it after the Ray container, and its last
// copy sees Ray's last words). It shares Ray's /tmp/ray through an
// emptyDir and copies the node's Ray logs (/tmp/ray/session_latest/logs:
// every worker process's whole output, the raylet's, the GCS server's on
// the head) to the evidence folder of the head's latest job every few
// seconds and on SIGTERM, so they outlive the pod. The RayCluster outlives
// the runs it serves: the job names its folder in its runtime env
// (EvidenceEnv), which the sidecar reads through the head's Jobs API at
// FQ_RAY_IP, the head service KubeRay gives every init container.
const RayLogsContainer = "raylogs"

// EvidenceEnv is the runtime env variable in which a RayJob names its
// attempt's evidence folder (trainer/raylogs.py EVIDENCE_ENV).
const EvidenceEnv = "RAYDROP_EVIDENCE"

// The runtime env variables of the run's stall window, which each rank's
// heartbeat watches its own step with (trainer/heartbeat.py), and the
// worker containers' variable that says they may ptrace (cluster.ptrace).
const (
	StallAfterEnv  = "RAYDROP_STALL_AFTER_S"
	StallFactorEnv = "RAYDROP_STALL_FACTOR"
	PySpyEnv       = "RAYDROP_PY_SPY"
)

// RayLogsSidecar is the RayLogsContainer of a Ray pod whose Ray container
// runs image (its Python runs the collector, from the trainer code).
func RayLogsSidecar(image string) corev1.Container {
	return corev1.Container{
		Name:          RayLogsContainer,
		Image:         image,
		RestartPolicy: ptr(corev1.ContainerRestartPolicyAlways),
		Command: []string{"python", CodeMountPath + "raylogs.py", "--logs", rayLogsPath + "/session_latest/logs",
			"--follow", "http://$(FQ_RAY_IP):8265", "--pod", "$(RAYDROP_POD)"},
		Env: []corev1.EnvVar{{Name: "RAYDROP_POD", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"},
		}}},
		// Small and fixed, as KubeRay's own init container is: Autopilot
		// bills every container's requests, and gives one that asks for no
		// ephemeral storage 1 GiB of it; this one writes nothing to disk.
		Resources: sameLimits(corev1.ResourceList{corev1.ResourceCPU: q("200m"), corev1.ResourceMemory: q("512Mi"), corev1.ResourceEphemeralStorage: q("100Mi")}),
		VolumeMounts: []corev1.VolumeMount{
			{Name: codeVolume, MountPath: CodeMountPath, ReadOnly: true},
			{Name: rayLogsVolume, MountPath: rayLogsPath, ReadOnly: true},
		},
	}
}

// NoticeFile is where a worker pod's preStop hook leaves the notice that
// its node is going away; the trainer's workers look for it after every
// step, save a checkpoint and stop (trainer/notice.py, DEFAULT_NOTICE).
const NoticeFile = "/tmp/raydrop/notice"

// PreStop is the worker container's preStop hook: it gives the notice, then
// holds the container's SIGTERM back while the workers save. GKE gives the
// pods of a reclaimed Spot VM 15 of its 30 seconds' notice
// (https://cloud.google.com/kubernetes-engine/docs/concepts/spot-vms), and
// the hook's time counts against the grace period
// (https://kubernetes.io/docs/concepts/containers/container-lifecycle-hooks/).
var PreStop = []string{"/bin/sh", "-c", "mkdir -p /tmp/raydrop && touch " + NoticeFile + " && sleep 12"}

// WorkerPlacement is where the GPU workers of capacity tier tier may run:
// the node labels GKE gives nodes of that kind, and the tolerations they
// need. A tier past the last is the last. Every tier asks for ephemeral
// storage on local SSD where the GPU type offers it (spec.NodeClasses),
// so the scratch volume is on the node's local SSD rather than its boot
// disk (https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-local-ssd).
//
//   - reservation: cloud.google.com/reservation-name and
//     reservation-affinity=specific, and cloud.google.com/reservation-project
//     for a reservation shared from another project
//     (https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations,
//     "Consuming reserved zonal resources");
//   - flexStart: cloud.google.com/gke-flex-start=true
//     (https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training);
//   - spot: cloud.google.com/gke-spot=true, tolerating the
//     cloud.google.com/gke-spot=true:NoSchedule taint Spot node pools carry
//     (https://cloud.google.com/kubernetes-engine/docs/how-to/spot-vms);
//   - onDemand: the accelerator alone.
func WorkerPlacement(s *spec.JobSpec, tier int) (map[string]string, []corev1.Toleration) {
	w := s.Cluster.Workers
	sel := map[string]string{
		names.NodeAccelerator:                     w.Accelerator,
		"cloud.google.com/gke-gpu-driver-version": w.GPUDriverVersion,
	}
	if spec.NodeClassOf(w.Accelerator).LocalSSD {
		sel[spec.NodeEphemeralLocalSSD] = "true"
	}
	t := s.Tier(tier)
	p := placementOf(t.Type)
	maps.Copy(sel, p.labels(t))
	return sel, slices.Clone(p.tolerations)
}

// tierPlacement is what one capacity tier type asks of a node beyond what
// every tier asks (the accelerator, its driver, local SSD).
type tierPlacement struct {
	typ string
	// mark is the node selector key that this type alone sets, so its
	// presence says the type; "" for onDemand, which sets none.
	mark string
	// labels are the node selector entries that ask for the tier's nodes.
	labels func(spec.Tier) map[string]string
	// tolerations are those of the taint the type's nodes carry.
	tolerations []corev1.Toleration
}

// tierPlacements is the one table of the capacity tier types' node
// selectors and tolerations, in spec.TierTypes' order: WorkerPlacement
// renders it, TierType inverts it, and tierKeys are read from it.
// TestTierTable fails when a type of spec.TierTypes has no row or a row
// does not read back as its type.
var tierPlacements = []tierPlacement{
	{typ: spec.TierReservation, mark: names.NodeReservation, labels: func(t spec.Tier) map[string]string {
		m := map[string]string{names.NodeReservation: t.Reservation, names.NodeReservationAffinity: "specific"}
		if t.Project != "" {
			m[names.NodeReservationProject] = t.Project
		}
		return m
	}},
	{typ: spec.TierFlexStart, mark: names.NodeFlexStart, labels: fixed(names.NodeFlexStart, "true")},
	{typ: spec.TierSpot, mark: names.NodeSpot, labels: fixed(names.NodeSpot, "true"),
		tolerations: []corev1.Toleration{{Key: names.NodeSpot, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}}},
	{typ: spec.TierOnDemand, labels: fixed()},
}

// fixed is a tier's labels that do not depend on the tier: key, value, ...
func fixed(kv ...string) func(spec.Tier) map[string]string {
	return func(spec.Tier) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
}

// placementOf is the table's row of tier type typ; validation admits no
// other, and an unknown one asks for no more than the accelerator.
func placementOf(typ string) tierPlacement {
	for _, p := range tierPlacements {
		if p.typ == typ {
			return p
		}
	}
	return tierPlacement{typ: typ, labels: fixed()}
}

// tierKeys are the node selector keys by which WorkerPlacement tells the
// capacity tiers apart: every key a row of the table may set. The other
// keys are the same on every tier, and GKE adds keys of its own to a pod's
// node selector at admission (Autopilot's cloud.google.com/compute-class,
// kubernetes.io/arch, …), so only these say which tier a pod asks for.
var tierKeys = func() []string {
	var keys []string
	for _, p := range tierPlacements {
		for k := range p.labels(spec.Tier{Reservation: "r", Project: "p"}) {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}()

// TierType is the capacity tier type a pod's node selector asks for, read
// from the key each type alone sets (the table's mark); onDemand sets none.
func TierType(sel map[string]string) string {
	for _, p := range tierPlacements {
		if p.mark != "" && sel[p.mark] != "" {
			return p.typ
		}
	}
	return spec.TierOnDemand
}

// OnTier reports whether a pod's node selector asks for the nodes of
// capacity tier tier: it agrees with the tier's placement on every key
// that tells tiers apart, present or absent; other keys do not count.
func OnTier(s *spec.JobSpec, tier int, sel map[string]string) bool {
	want, _ := WorkerPlacement(s, tier)
	for _, k := range tierKeys {
		w, wok := want[k]
		g, gok := sel[k]
		if w != g || wok != gok {
			return false
		}
	}
	return true
}

// RayJob is one attempt of the run: the trainer submitted to the spec's
// cluster through clusterSelector, under a submission ID derived from the
// run, so a retried submitter finds the job instead of starting another.
func RayJob(s *spec.JobSpec, run Run) *rayv1.RayJob {
	name := names.RayJob(run.ID, run.Attempt)
	return &rayv1.RayJob{
		TypeMeta: metav1.TypeMeta{APIVersion: rayv1.GroupVersion.String(), Kind: "RayJob"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: s.Cluster.Namespace,
			Labels: map[string]string{
				names.LabelManagedBy: names.ManagedBy,
				names.LabelRunID:     run.ID,
				names.LabelAttempt:   strconv.Itoa(run.Attempt),
				names.LabelSpecName:  s.Name,
			},
			Annotations: map[string]string{
				names.AnnotSpecHash: run.SpecHash,
				names.AnnotSource:   run.Source,
			},
		},
		Spec: rayv1.RayJobSpec{
			Entrypoint:      Entrypoint(s, run),
			RuntimeEnvYAML:  RuntimeEnvYAML(s, run),
			ClusterSelector: map[string]string{"ray.io/cluster": s.Cluster.Name},
			JobId:           names.SubmissionID(run.ID, run.Attempt),
		},
	}
}

// CheckAttempt is the attempt number of a run's data check: it comes
// before attempt 1, and its RayJob is names.RayJob(run, CheckAttempt).
const CheckAttempt = 0

// CheckJob is the run's data check: trainer/datacheck.py with the
// trainer's own arguments, run by the Ray job's driver on the head (the
// worker group is at zero meanwhile), writing data-check.json in the run's
// storage path. price is the GPU-hour price its estimate uses.
func CheckJob(s *spec.JobSpec, run Run, price float64) *rayv1.RayJob {
	run.Attempt = CheckAttempt
	job := RayJob(s, run)
	args := append([]string{"python", CheckPath}, TrainerArgs(s, run)[1:]...)
	args = append(args, "--gpu-hour-usd", ftoa(price))
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = ShellQuote(a)
	}
	job.Spec.Entrypoint = strings.Join(quoted, " ")
	return job
}

// StoragePath is Ray Train's storage_path for a run: every attempt writes
// its experiment folder under it.
func StoragePath(s *spec.JobSpec, runID string) string {
	p := "gs://" + s.Output.Bucket + "/"
	if s.Output.Prefix != "" {
		p += s.Output.Prefix + "/"
	}
	return p + runID
}

// ExperimentName is Ray Train's experiment name (RunConfig.name) of an attempt.
func ExperimentName(attempt int) string { return "attempt-" + strconv.Itoa(attempt) }

// Storage is the run's storage path (Ray Train's storage_path, where the
// data check writes too) as a bucket and an object prefix.
func Storage(s *spec.JobSpec, runID string) (bucket, prefix string) {
	bucket, prefix, _ = strings.Cut(strings.TrimPrefix(StoragePath(s, runID), "gs://"), "/")
	return bucket, prefix
}

// Experiment is where an attempt's Ray Train experiment lives: its bucket
// and the object prefix of its experiment folder.
func Experiment(s *spec.JobSpec, runID string, attempt int) (bucket, prefix string) {
	bucket, prefix, _ = strings.Cut(strings.TrimPrefix(StoragePath(s, runID)+"/"+ExperimentName(attempt), "gs://"), "/")
	return bucket, prefix
}

// TrainerArgs is the trainer's argv after the interpreter: the fixed script
// path, then each spec value as its own argument.
func TrainerArgs(s *spec.JobSpec, run Run) []string {
	t, l := s.Training, s.LoRA
	args := []string{
		ScriptPath,
		"--run-id", run.ID,
		"--storage-path", StoragePath(s, run.ID),
		"--experiment-name", ExperimentName(run.Attempt),
		"--mark-notice", "gs://" + s.Output.Bucket + "/" + names.MarkNotice(run.ID, run.Attempt),
		"--model-id", s.Model.ID,
		"--dataset-id", s.Dataset.DataSource(),
		"--dataset-split", s.Dataset.Split,
		"--num-workers", itoa(t.Workers),
		"--use-gpu", "true",
	}
	if rev := cmp.Or(run.DatasetRevision, s.Dataset.Revision); rev != "" {
		args = append(args, "--dataset-revision", rev)
	}
	if s.Dataset.EvalSplit != "" {
		args = append(args, "--eval-split", s.Dataset.EvalSplit)
	}
	if t.AcceleratorType != "" {
		args = append(args, "--accelerator-type", t.AcceleratorType)
	}
	args = append(args,
		"--quantization", s.Model.Quantization,
		"--attention", s.Model.Attention,
		"--lora-r", itoa(l.R),
		"--lora-alpha", itoa(l.Alpha),
		"--lora-dropout", ftoa(l.Dropout),
		"--lora-target-modules", l.TargetModules,
		"--lora-vision-tower", btoa(l.VisionTower),
		"--train-embeddings", btoa(l.TrainEmbeddings),
		"--completion-only-loss", btoa(t.CompletionOnlyLoss),
		"--epochs", itoa(t.Epochs),
		"--per-device-batch-size", itoa(t.PerDeviceBatchSize),
		"--gradient-accumulation-steps", itoa(t.GradientAccumulationSteps),
		"--learning-rate", ftoa(t.LearningRate),
		"--lr-scheduler", t.LRScheduler,
		"--warmup-ratio", ftoa(t.WarmupRatio),
		"--max-grad-norm", ftoa(t.MaxGradNorm),
		"--max-seq-length", itoa(t.MaxSeqLength),
		"--max-dropped-share", ftoa(t.MaxDroppedShare),
		"--eval-share", ftoa(s.Dataset.EvalShare),
		"--sample-answers", itoa(s.Dataset.SampleAnswers),
		"--logging-steps", itoa(t.LoggingSteps),
		"--save-strategy", t.SaveStrategy,
		"--save-steps", itoa(t.SaveSteps),
		"--gradient-checkpointing", btoa(t.GradientCheckpointing),
		"--seed", itoa(t.Seed),
	)
	if t.MaxSteps > 0 {
		args = append(args, "--max-steps", itoa(t.MaxSteps))
	}
	if run.ResumeFrom != "" {
		args = append(args, "--resume-from", run.ResumeFrom)
	}
	if m := run.Model; m != nil {
		args = append(args, "--staged-model", m.URI, "--model-revision", m.Commit,
			"--stage-model", btoa(!m.Staged && m.StagedBy == run.ID))
	} else if s.Model.Revision != "" {
		// Not staged: the workers load this revision from the Hub.
		args = append(args, "--model-revision", s.Model.Revision)
	}
	return args
}

// Entrypoint is the RayJob entrypoint: KubeRay hands it to bash, and Ray's
// job manager runs the joined words through a shell once more. Every
// argument is shell-quoted, and the spec allows only characters no shell
// treats specially in any value that reaches it, so both shells see the
// same argv.
func Entrypoint(s *spec.JobSpec, run Run) string {
	args := append([]string{"python"}, TrainerArgs(s, run)...)
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = ShellQuote(a)
	}
	return strings.Join(quoted, " ")
}

// ShellQuote returns s as one POSIX shell word: unchanged when it holds only
// characters that no shell treats specially, else in single quotes.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/:,=@+-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// DatasetFormatEnv carries the spec's dataset format (its template and
// system message are free text) to the trainer as data: Ray's job manager
// sets it in the driver's and the workers' environment, and no shell ever
// reads it. The trainer reads it as the default of --dataset-format.
const DatasetFormatEnv = "RAYDROP_DATASET_FORMAT"

// StopWaitSeconds is how long `ray job stop` (a deleted RayJob, a
// cancelled run) leaves the driver between its SIGTERM and a SIGKILL. Ray's
// job supervisor waits RAY_JOB_STOP_WAIT_TIME_S, 3 s by default, read from
// its own environment, which is the job's runtime env; on SIGTERM the driver
// has the workers evaluate and save a checkpoint, then writes the mark
// (trainer/notice.py, STOP_WAIT_S), which takes far longer than 3 s.
const StopWaitSeconds = 120

// DatasetFormat is what DatasetFormatEnv holds: the dataset section's format
// fields, as JSON.
func DatasetFormat(s *spec.JobSpec) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the prompt's <PRODUCT> stays readable in the RayJob
	if err := enc.Encode(struct {
		Format   string        `json:"format"`
		Template spec.Template `json:"template"`
		Messages spec.Messages `json:"messages"`
	}{s.Dataset.Format, s.Dataset.Template, s.Dataset.Messages}); err != nil {
		panic(err) // plain strings always marshal
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// RuntimeEnvYAML is the RayJob runtime env: the trainer's pinned
// requirements, the single source of truth shared with its tests, unless
// the run's images hold them already (run.Preinstalled); the job
// supervisor's stop wait and the dataset format.
func RuntimeEnvYAML(s *spec.JobSpec, run Run) string {
	var pip []string
	if !run.Preinstalled {
		pip = trainer.Requirements()
	}
	b, err := yaml.Marshal(struct {
		Pip     []string          `json:"pip,omitempty"`
		EnvVars map[string]string `json:"env_vars"`
	}{pip, map[string]string{
		"RAY_JOB_STOP_WAIT_TIME_S": strconv.Itoa(StopWaitSeconds),
		DatasetFormatEnv:           DatasetFormat(s),
		EvidenceEnv:                EvidenceFolder(s, run.ID, run.Attempt),
		StallAfterEnv:              strconv.FormatFloat(time.Duration(s.Limits.StallAfter).Seconds(), 'f', -1, 64),
		StallFactorEnv:             strconv.FormatFloat(s.Limits.StallFactor, 'f', -1, 64),
	}})
	if err != nil {
		panic(err) // strings always marshal
	}
	return string(b)
}

// podEnv is the Ray containers' environment: the Hugging Face token from
// its Secret, and the model, dataset and resume caches on the local-SSD
// volume rather than the boot disk (a 4B model is about 9 GB, downloaded
// once per node and read by every worker on it).
func podEnv(s *spec.JobSpec) []corev1.EnvVar {
	return []corev1.EnvVar{{
		Name: hfTokenEnv,
		ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: s.Cluster.HFSecret.Name},
			Key:                  s.Cluster.HFSecret.Key,
		}},
	}, {
		Name: "HF_HOME", Value: scratchPath + "huggingface",
	}, {
		Name: scratchEnv, Value: scratchPath,
	}}
}

// EvidenceFolder is the gs:// URI of an attempt's evidence folder
// (pkg/evidence), ending in a slash.
func EvidenceFolder(s *spec.JobSpec, runID string, attempt int) string {
	bucket, runFolder := Storage(s, runID)
	return "gs://" + bucket + "/" + evidence.AttemptFolder(runFolder, attempt) + "/"
}

func mounts() []corev1.VolumeMount {
	return []corev1.VolumeMount{
		{Name: codeVolume, MountPath: CodeMountPath},
		{Name: scratchVolume, MountPath: scratchPath},
		{Name: rayLogsVolume, MountPath: rayLogsPath},
	}
}

// volumes are a Ray pod's volumes: the trainer code, and the scratch
// emptyDir, capped at size when given.
func volumes(configMap string, size *resource.Quantity) []corev1.Volume {
	return []corev1.Volume{
		{Name: codeVolume, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: configMap},
		}}},
		{Name: scratchVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: size}}},
		{Name: rayLogsVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}
}

func sameLimits(l corev1.ResourceList) corev1.ResourceRequirements {
	return corev1.ResourceRequirements{Limits: l, Requests: l.DeepCopy()}
}

// q parses a quantity the spec has already validated.
func q(s string) resource.Quantity { return resource.MustParse(s) }

func ptr[T any](v T) *T { return &v }

func itoa(i int) string { return strconv.Itoa(i) }

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func btoa(b bool) string { return strconv.FormatBool(b) }
