// Package spec defines raydrop's job spec: the JSON document a user drops into
// the intake bucket's jobs/ folder or publishes to the requests topic. It
// decodes strictly, fills every default from the reference workload (Google's
// Gemma 3 vision fine-tune with Ray on GKE), validates every field against an
// allowlist and reports every problem at once, and generates the JSON Schema
// editors use.
//
// The rules live in one place: the `spec` struct tags below drive the
// validator, the generated schema and the documentation alike.
package spec

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/raydrop/raydrop/trainer"
)

// APIVersion is the only job spec format this build accepts.
const APIVersion = "raydrop.dev/v1"

// Kind names the document type inside APIVersion.
const Kind = "FineTuneJob"

// MaxBytes is the largest spec accepted, in bytes.
const MaxBytes = 256 << 10

// JobSpec is a fine-tuning job. Every field except cluster.serviceAccount,
// cluster.reservation and output.bucket has a default; the defaults reproduce
// the reference workload. cluster.reservation may be left out when
// cluster.capacity names no reservation tier without its own reservation.
type JobSpec struct {
	Schema     string `json:"$schema,omitempty" spec:"optional,max=512" doc:"JSON Schema of this document, for editors; ignored."`
	APIVersion string `json:"apiVersion" spec:"required,enum=raydrop.dev/v1" doc:"Format version of this document."`
	Kind       string `json:"kind" spec:"enum=FineTuneJob" doc:"Document type."`
	Name       string `json:"name" spec:"kind=label,max=40,optional" doc:"Human name of the job; shown in events and used in labels. Defaults to the object's base name."`
	RunID      string `json:"runId,omitempty" spec:"kind=runid,optional" doc:"Caller-chosen idempotency key for requests published to the topic: the same runId is the same run."`

	Model    Model    `json:"model" doc:"The base model."`
	Dataset  Dataset  `json:"dataset" doc:"The training data."`
	LoRA     LoRA     `json:"lora" doc:"The LoRA adapter."`
	Training Training `json:"training" doc:"Hyper-parameters and scaling."`
	Cluster  Cluster  `json:"cluster" doc:"The KubeRay RayCluster the job runs on."`
	Output   Output   `json:"output" doc:"Where checkpoints are written."`
	Limits   Limits   `json:"limits" doc:"Deadlines and retries."`
	Debug    Debug    `json:"debug" doc:"What raydrop keeps of a failed run for a person to look at."`
	Sweep    Sweep    `json:"sweep,omitzero" doc:"A search over the spec's fields: one trial run per combination (grid) or draw (random), ranked by held-out loss, with optional early stopping. Left out: one run."`
}

// Model selects the base model and how it is loaded.
type Model struct {
	ID           string `json:"id" spec:"kind=hfrepo" doc:"Hugging Face model repository id."`
	Revision     string `json:"revision,omitempty" spec:"kind=revision,max=128,optional" doc:"Hub model revision (branch, tag or commit) to train from; empty: the default branch. The pipeline resolves it to a commit when the first attempt is submitted, and every attempt trains from that commit (staged once in the deployment's bucket where the deployment stages models)."`
	Attention    string `json:"attention" spec:"enum=sdpa|eager" doc:"Attention implementation; the reference used eager."`
	Quantization string `json:"quantization" spec:"enum=none|4bit" doc:"Base weight quantisation; 4bit is QLoRA (bitsandbytes NF4) as in the reference, none keeps bf16 weights."`
}

// Dataset selects the training data: where it is, and how a row becomes a
// conversation.
type Dataset struct {
	ID       string `json:"id" spec:"kind=hfrepo" doc:"Hugging Face dataset repository id; not used when source is set."`
	Source   string `json:"source" spec:"kind=gsfolder,max=1024,optional" doc:"A gs:// folder of the deployment's data buckets holding the rows instead of the Hub: the ImageFolder layout (images beside metadata.jsonl or metadata.csv with a file_name column), or JSON Lines / Parquet files whose image fields are paths relative to the file, gs:// URIs or embedded bytes; a split's files are <source>/<split>/ or <source>/<split>*.jsonl|parquet (train may also be the folder itself)."`
	Revision string `json:"revision" spec:"kind=revision,max=128,optional" doc:"Hub dataset revision (branch, tag or commit) to pin; empty: the default branch. The revision used is recorded in the data check."`
	// Format says how a row becomes a conversation.
	Format   string   `json:"format" spec:"enum=template|messages" doc:"template: the row's columns fill dataset.template; messages: a conversation column in TRL's vision-language format (role/content parts with {\"type\": \"image\"} placeholders) and an images column."`
	Template Template `json:"template" doc:"The conversation made of each row when format is template; the defaults are the tutorial's prompt and columns."`
	Messages Messages `json:"messages" doc:"The columns read when format is messages."`
	// Check asks for the data check before the first attempt.
	Check bool   `json:"check" doc:"Check the data and the model on the Ray head before any GPU worker is asked for (trainer/datacheck.py: every row encoded as training will, every image decoded); a run whose data or model is unusable fails InvalidData or InvalidModel with no GPU worker created. On by default; false starts the GPU workers at once, and bad data is then found by the trainer on them."`
	Split string `json:"split" spec:"kind=token,max=64" doc:"Dataset split to train on."`
	// EvalSplit and EvalShare choose the held-out rows every checkpoint is
	// evaluated on.
	EvalSplit string  `json:"evalSplit" spec:"kind=token,max=64,optional" doc:"Dataset split to evaluate on; empty: hold out evalShare of the training split."`
	EvalShare float64 `json:"evalShare" spec:"min=0,max=0.5" doc:"Share of the training split held out for evaluation (at least one row) when evalSplit is empty, drawn with training.seed; 0 turns evaluation off."`
	// SampleAnswers is how many held-out rows the tuned and the base model
	// answer after training.
	SampleAnswers int `json:"sampleAnswers" spec:"min=0,max=64" doc:"Held-out rows answered after training by the tuned model and by the base model (greedy, at most 256 new tokens), written beside the completion mark; 0: none."`
}

// Template turns a row into a conversation: an optional system message, a
// user turn of the prompt (its {column} placeholders filled from the row) and
// the row's images, and the answer column as the assistant's turn.
type Template struct {
	System         string   `json:"system" spec:"kind=text,max=8192,optional" doc:"System message; empty: none."`
	Prompt         string   `json:"prompt" spec:"kind=template,max=32768" doc:"The user's prompt: free text with {column} placeholders filled from each row; {{ and }} are literal braces."`
	Answer         string   `json:"answer" spec:"kind=column,max=128" doc:"Column holding the answer the model learns to give."`
	Images         []string `json:"images" spec:"min=0,max=16,kind=column" doc:"Columns holding the row's images (each an image or a list of images), in order; empty: text only."`
	ImagePlacement string   `json:"imagePlacement" spec:"enum=afterPrompt|beforePrompt" doc:"Where the images go in the user's turn."`
}

// Messages names the columns of a conversational dataset.
type Messages struct {
	Column       string `json:"column" spec:"kind=column,max=128" doc:"Column holding the conversation: a list of {role, content} turns (system, user, assistant); every assistant turn is a target."`
	ImagesColumn string `json:"imagesColumn" spec:"kind=column,max=128" doc:"Column holding the row's images, one per {\"type\": \"image\"} placeholder, in order."`
}

// DataSource is where the trainer reads the rows: source when set, else
// the Hub id.
func (d Dataset) DataSource() string {
	if d.Source != "" {
		return d.Source
	}
	return d.ID
}

// LoRA configures the adapter.
type LoRA struct {
	R               int     `json:"r" spec:"min=1,max=1024" doc:"Adapter rank."`
	Alpha           int     `json:"alpha" spec:"min=1,max=4096" doc:"Adapter scaling alpha."`
	Dropout         float64 `json:"dropout" spec:"min=0,max=0.9" doc:"Adapter dropout probability."`
	TargetModules   string  `json:"targetModules" spec:"kind=modules,max=256" doc:"PEFT target modules: all-linear, or a comma-separated list of module names."`
	VisionTower     bool    `json:"visionTower" doc:"Also adapt the SigLIP vision tower (the reference did, through all-linear)."`
	TrainEmbeddings bool    `json:"trainEmbeddings" doc:"Train full copies of the token embedding and LM head (the reference's modules_to_save)."`
}

// Training holds the optimiser settings and the Ray Train scaling.
type Training struct {
	Epochs                    int     `json:"epochs" spec:"min=1,max=1000" doc:"Passes over the dataset."`
	MaxSteps                  int     `json:"maxSteps" spec:"min=0,max=10000000" doc:"Stop after this many optimizer steps; 0 means no limit."`
	PerDeviceBatchSize        int     `json:"perDeviceBatchSize" spec:"min=1,max=1024" doc:"Examples per GPU per micro-batch (the reference: 1)."`
	GradientAccumulationSteps int     `json:"gradientAccumulationSteps" spec:"min=1,max=1024" doc:"Micro-batches per optimizer step (the reference: 4; 4 x 1 keeps its global batch)."`
	LearningRate              float64 `json:"learningRate" spec:"gt=0,max=1" doc:"Peak learning rate."`
	LRScheduler               string  `json:"lrScheduler" spec:"enum=constant|constant_with_warmup|linear|cosine" doc:"Learning-rate schedule; warmupRatio applies to every schedule."`
	WarmupRatio               float64 `json:"warmupRatio" spec:"min=0,max=0.5" doc:"Share of the steps spent warming up."`
	MaxGradNorm               float64 `json:"maxGradNorm" spec:"min=0,max=1000" doc:"Gradient clipping norm; 0 disables clipping."`
	MaxSeqLength              int     `json:"maxSeqLength" spec:"min=16,max=131072" doc:"Longest tokenised example, image tokens included; longer ones are left out (truncating would cut the image block or the answer), counted in the metrics and the events."`
	MaxDroppedShare           float64 `json:"maxDroppedShare" spec:"min=0,max=1" doc:"Largest share of the dataset's rows that may be left out as longer than maxSeqLength; above it the run fails before training, saying how many rows were too long."`
	LoggingSteps              int     `json:"loggingSteps" spec:"min=1,max=100000" doc:"Optimizer steps between metric reports."`
	SaveStrategy              string  `json:"saveStrategy" spec:"enum=epoch|steps" doc:"When to write a checkpoint; either way the last step is saved, so every run leaves a model."`
	SaveSteps                 int     `json:"saveSteps" spec:"min=1,max=10000000" doc:"Optimizer steps between checkpoints when saveStrategy is steps."`
	GradientCheckpointing     bool    `json:"gradientCheckpointing" doc:"Recompute activations in the backward pass to save memory (the reference: true)."`
	CompletionOnlyLoss        bool    `json:"completionOnlyLoss" doc:"Compute the loss on the assistant's answer only; false also trains on the prompt, as the reference did."`
	Seed                      int     `json:"seed" spec:"min=0,max=2147483647" doc:"Random seed."`
	Workers                   int     `json:"workers" spec:"min=1,max=4096" doc:"Ray Train workers, one per GPU."`
	AcceleratorType           string  `json:"acceleratorType" spec:"kind=token,max=32,optional" doc:"Ray accelerator type the workers require (empty: any GPU)."`
}

// Cluster describes the RayCluster: the head, the GPU worker group and where
// its pods may run.
type Cluster struct {
	Name           string     `json:"name" spec:"kind=dns1035,max=53" doc:"RayCluster name; runs naming the same cluster queue behind each other."`
	Namespace      string     `json:"namespace" spec:"kind=dns1123,max=63" doc:"Kubernetes namespace of the cluster and the jobs."`
	RayVersion     string     `json:"rayVersion" spec:"kind=version" doc:"Ray version of the images."`
	ServiceAccount string     `json:"serviceAccount" spec:"required,kind=dns1123,max=63" doc:"Kubernetes service account of the Ray pods, bound by Workload Identity to a Google service account that may write output.bucket."`
	Reservation    string     `json:"reservation" spec:"optional,kind=reservation" doc:"Compute Engine reservation that holds the GPU nodes: the reservation of every capacity tier of type reservation that names none (the default capacity is one such tier). Required unless every reservation tier names its own."`
	Capacity       []Tier     `json:"capacity" spec:"min=1,max=4" doc:"Where the GPU worker nodes come from: tiers tried in order, each for its wait, the pipeline moving the workers that are still pending to the next (see docs/capacity.md). The default is the single reservation of cluster.reservation."`
	HFSecret       SecretRef  `json:"hfSecret" doc:"Kubernetes Secret holding the Hugging Face token; the token itself never appears in a spec."`
	Head           Head       `json:"head" doc:"The Ray head pod."`
	Workers        WorkerPool `json:"workers" doc:"The GPU worker group."`
	Ptrace         bool       `json:"ptrace" doc:"Give the GPU worker containers the SYS_PTRACE capability, so that the stacks a stalled rank writes include py-spy's native frames (py-spy dump --native): where a collective waits. The Pod Security Standards' baseline and restricted levels forbid it; see docs/failures.md for GKE Autopilot. Off: the stacks are Python's own, which need no privilege."`
}

// StockImage is the stock Ray image of version rayVersion: the head's, or
// with gpu the workers' (CUDA). Its Python is 3.9 for Ray 2.48: the trainer
// image (trainer/image) is built on the py311 variant instead.
func StockImage(rayVersion string, gpu bool) string {
	if gpu {
		return "rayproject/ray:" + rayVersion + "-gpu"
	}
	return "rayproject/ray:" + rayVersion
}

// HeadImage is the head container's image: cluster.head.image, else the
// stock Ray image (a spec the pipeline admitted names the deployment's
// trainer image there when the deployment has one: runs.Record.UseImages).
func (c Cluster) HeadImage() string {
	if c.Head.Image != "" {
		return c.Head.Image
	}
	return StockImage(c.RayVersion, false)
}

// WorkerImage is the workers' image, as HeadImage is the head's.
func (c Cluster) WorkerImage() string {
	if c.Workers.Image != "" {
		return c.Workers.Image
	}
	return StockImage(c.RayVersion, true)
}

// The dataset formats.
const (
	FormatTemplate = "template" // columns fill dataset.template
	FormatMessages = "messages" // a conversation column and an images column
)

// The capacity tier types: how GKE gets the GPU nodes
// (https://cloud.google.com/kubernetes-engine/docs/concepts/consumption-options).
const (
	TierReservation = "reservation" // a specific Compute Engine reservation
	TierFlexStart   = "flexStart"   // Dynamic Workload Scheduler flex-start
	TierSpot        = "spot"        // Spot VMs: reclaimable at any time
	TierOnDemand    = "onDemand"    // on-demand VMs, where the region has them
)

// TierTypes is every capacity tier type, in the order docs and messages
// list them: the one list that the enum of Tier.Type (TestTierTypesEnum),
// the node placements (manifests), the events' schema, the local cloud's
// scenarios and the deployment's preflight read.
var TierTypes = []string{TierReservation, TierFlexStart, TierSpot, TierOnDemand}

// Tier is one way of getting the GPU nodes; cluster.capacity tries them in
// order.
type Tier struct {
	Type        string   `json:"type" spec:"enum=reservation|flexStart|spot|onDemand" doc:"How the nodes are obtained: a specific reservation, flex-start (Dynamic Workload Scheduler: nodes when capacity frees up, held for at most the run's deadline), Spot VMs (cheap, reclaimable with 30 s notice) or on-demand VMs."`
	Reservation string   `json:"reservation" spec:"optional,kind=reservation" doc:"For a reservation tier, the Compute Engine reservation (empty: cluster.reservation); empty for every other type."`
	Project     string   `json:"project,omitempty" spec:"optional,kind=project" doc:"For a reservation tier, the Google Cloud project that owns the reservation when it is shared from another project (empty: the cluster's own project); empty for every other type."`
	Wait        Duration `json:"wait" spec:"min=0s,max=24h" doc:"How long the workers may wait for nodes on this tier before the pipeline moves them to the next; at least 1m on every tier but the last, 0 on the last (it waits until limits.startDeadline)."`
	GPUHourUSD  float64  `json:"gpuHourUsd" spec:"min=0,max=10000" doc:"Price of one GPU-hour on this tier, for the cost estimate; 0: the pipeline's price (RAYDROP_GPU_HOUR_USD)."`
}

// SecretRef names a key of a Kubernetes Secret.
type SecretRef struct {
	Name string `json:"name" spec:"kind=dns1123,max=63" doc:"Secret name."`
	Key  string `json:"key" spec:"kind=secretkey,max=253" doc:"Key inside the Secret."`
}

// Head sizes the Ray head pod.
type Head struct {
	Image            string `json:"image" spec:"optional,kind=image" doc:"Head container image. Empty: the deployment's trainer image (RAYDROP_TRAINER_IMAGE, built from trainer/image with the trainer's dependencies installed), else the stock rayproject/ray:<rayVersion>; an image other than the trainer image has the trainer's requirements pip-installed by the runtime env on every node."`
	CPU              string `json:"cpu" spec:"kind=quantity" doc:"CPU request and limit."`
	Memory           string `json:"memory" spec:"kind=quantity" doc:"Memory request and limit."`
	EphemeralStorage string `json:"ephemeralStorage" spec:"kind=quantity" doc:"Ephemeral storage request and limit."`
}

// WorkerPool sizes the GPU worker group and places it on the reserved nodes.
type WorkerPool struct {
	GroupName        string `json:"groupName" spec:"kind=dns1123,max=63" doc:"Worker group name."`
	Image            string `json:"image" spec:"optional,kind=image" doc:"Worker container image. Empty: the deployment's trainer image (RAYDROP_TRAINER_IMAGE), else the stock rayproject/ray:<rayVersion>-gpu; an image other than the trainer image has the trainer's requirements pip-installed by the runtime env on every node."`
	Replicas         int    `json:"replicas" spec:"min=0,max=1000" doc:"Worker pods (nodes) while a run is active."`
	MinReplicas      int    `json:"minReplicas" spec:"min=0,max=1000" doc:"Lower bound for the autoscaler while a run is active."`
	MaxReplicas      int    `json:"maxReplicas" spec:"min=1,max=1000" doc:"Upper bound for the autoscaler."`
	GPUs             int    `json:"gpus" spec:"min=1,max=16" doc:"GPUs per worker pod."`
	CPU              string `json:"cpu" spec:"kind=quantity" doc:"CPU request and limit per worker."`
	Memory           string `json:"memory" spec:"kind=quantity" doc:"Memory request and limit per worker."`
	Accelerator      string `json:"accelerator" spec:"kind=label,max=63" doc:"GKE accelerator node label value."`
	GPUDriverVersion string `json:"gpuDriverVersion" spec:"enum=latest|default|disabled" doc:"GKE GPU driver version node label value."`
	Scratch          string `json:"scratch,omitempty" spec:"optional,kind=storage" doc:"Ephemeral storage of each worker pod (its request and limit, and the size of the node-local volume holding the Hugging Face cache and the resume copy), on local SSD where the GPU type offers it; empty: sized from the model, four copies of its bf16 weights and 64Gi of headroom (97Gi for Gemma 3 4B, 269Gi for 27B). At most what GKE Autopilot allows a pod on those nodes."`
}

// Output says where Ray Train writes the run's checkpoints.
type Output struct {
	Bucket string `json:"bucket" spec:"required,kind=bucket" doc:"Cloud Storage bucket for checkpoints; the Ray service account must be able to write it."`
	Prefix string `json:"prefix" spec:"kind=prefix,max=512,optional" doc:"Object prefix under the bucket; a run writes to gs://bucket/prefix/<runId>/."`
}

// Limits bounds how long a run may take and how often it is retried.
type Limits struct {
	Deadline      Duration `json:"deadline" spec:"min=1m,max=168h" doc:"Longest a run may take from submission to its end."`
	StartDeadline Duration `json:"startDeadline" spec:"min=1m,max=24h" doc:"Longest a submitted job may take to start running."`
	Retries       int      `json:"retries" spec:"min=0,max=10" doc:"Retries after a failure outside the training code (a lost head or worker); each resumes from the latest checkpoint. Preemptions do not count here."`
	Preemptions   int      `json:"preemptions" spec:"min=0,max=100" doc:"Attempts that may be lost to preemption (a Spot VM reclaimed, a node shut down) before the run fails; each resumes from the newest checkpoint and none counts against retries."`
	StallAfter    Duration `json:"stallAfter" spec:"min=10s,max=24h" doc:"A running attempt whose ranks have not ended a step (nor begun an evaluation or a save) for this long, counted from its first step, is suspected stalled; the window is the longer of this and stallFactor median steps. Keep it well under the process group's 30-minute collective timeout."`
	StallFactor   float64  `json:"stallFactor" spec:"min=1,max=1000" doc:"How many median step times without progress make a stall, when that is longer than stallAfter."`
	StallRestarts int      `json:"stallRestarts" spec:"min=0,max=10" doc:"How many times a stalled attempt is restarted from its latest checkpoint (once every rank's stacks are in the evidence) before the run fails with cause Stalled; these do not count against retries."`
}

// Debug is what raydrop keeps of a failed run for a look.
type Debug struct {
	KeepFailedFor Duration `json:"keepFailedFor" spec:"min=0s,max=24h" doc:"Keep the Ray head pod of a run that failed for this long (never the GPU workers, which go to zero as always), so that its Ray dashboard and session logs can be looked at; the cluster's next run waits meanwhile, then the head pod is deleted (KubeRay starts a fresh one) and the cluster passes on. raydrop status says until when. 0: not kept."`
}

// Defaults returns the spec of the reference workload, without the three
// values every project must choose. The step's shape (batch, accumulation,
// gradient checkpointing) and the length filter come from the trainer's
// defaults.json, which the trainer's command line and its GPU benchmark
// read too.
func Defaults() JobSpec {
	td := trainer.Defaults()
	return JobSpec{
		APIVersion: APIVersion,
		Kind:       Kind,
		Model: Model{
			ID:           "google/gemma-3-4b-it",
			Attention:    "sdpa",
			Quantization: "none",
		},
		Dataset: Dataset{
			ID:     "philschmid/amazon-product-descriptions-vlm",
			Format: FormatTemplate,
			Template: Template{
				System:         td.Template.System,
				Prompt:         td.Template.Prompt,
				Answer:         td.Template.Answer,
				Images:         td.Template.Images,
				ImagePlacement: td.Template.ImagePlacement,
			},
			Messages:      Messages{Column: td.Messages.Column, ImagesColumn: td.Messages.ImagesColumn},
			Split:         "train",
			EvalShare:     0.05,
			SampleAnswers: 8,
			Check:         true,
		},
		LoRA: LoRA{
			R:             16,
			Alpha:         16,
			Dropout:       0.05,
			TargetModules: "all-linear",
		},
		Training: Training{
			Epochs:                    3,
			PerDeviceBatchSize:        td.PerDeviceBatchSize,
			GradientAccumulationSteps: td.GradientAccumulationSteps,
			LearningRate:              2e-4,
			LRScheduler:               "constant",
			WarmupRatio:               0.03,
			MaxGradNorm:               0.3,
			MaxSeqLength:              td.MaxSeqLength,
			MaxDroppedShare:           td.MaxDroppedShare,
			LoggingSteps:              10,
			SaveStrategy:              "epoch",
			SaveSteps:                 100,
			GradientCheckpointing:     td.GradientCheckpointing,
			CompletionOnlyLoss:        true,
			Seed:                      42,
			Workers:                   16,
			AcceleratorType:           "B200",
		},
		Cluster: Cluster{
			Name:       "gemma3-tuning",
			Namespace:  "default",
			RayVersion: "2.48.0",
			HFSecret:   SecretRef{Name: "hf-secret", Key: "hf_api_token"},
			Head: Head{
				CPU:              "24",
				Memory:           "64Gi",
				EphemeralStorage: "9Gi",
			},
			Workers: WorkerPool{
				GroupName:        "gpu-group",
				Replicas:         2,
				MinReplicas:      1,
				MaxReplicas:      5,
				GPUs:             8,
				CPU:              "80",
				Memory:           "320Gi",
				Accelerator:      "nvidia-b200",
				GPUDriverVersion: "latest",
			},
			Capacity: []Tier{{Type: TierReservation}},
		},
		Output: Output{Prefix: "raydrop"},
		Sweep:  Sweep{Search: SearchGrid, EarlyStopping: EarlyStopping{Rule: StopNone, MinTrials: 3}},
		Limits: Limits{
			Deadline:      Duration(24 * hour),
			StartDeadline: Duration(30 * minute),
			Retries:       1,
			Preemptions:   10,
			StallAfter:    Duration(10 * minute),
			StallFactor:   5,
			StallRestarts: 1,
		},
	}
}

// Tiers is the capacity tiers with every reservation tier's reservation
// filled in from cluster.reservation where it names none. A spec without
// tiers (one recorded before cluster.capacity existed) has the default
// one, cluster.reservation, so it is never empty.
func (s *JobSpec) Tiers() []Tier {
	tiers := s.Cluster.Capacity
	if len(tiers) == 0 {
		tiers = []Tier{{Type: TierReservation}}
	}
	out := make([]Tier, len(tiers))
	for i, t := range tiers {
		if t.Type == TierReservation && t.Reservation == "" {
			t.Reservation = s.Cluster.Reservation
		}
		out[i] = t
	}
	return out
}

// Tier is tier i of Tiers; an index past the last is the last.
func (s *JobSpec) Tier(i int) Tier {
	tiers := s.Tiers()
	return tiers[min(max(i, 0), len(tiers)-1)]
}

// Name is how the tier is shown: its type, and a reservation's name
// (project/name for one shared from another project).
func (t Tier) Name() string {
	if t.Type == TierReservation && t.Reservation != "" {
		if t.Project != "" {
			return t.Type + " " + t.Project + "/" + t.Reservation
		}
		return t.Type + " " + t.Reservation
	}
	return t.Type
}

// Hash identifies the effective spec, defaults included: two specs with the
// same hash train the same way.
func (s *JobSpec) Hash() string {
	c := *s
	c.Schema, c.RunID = "", "" // neither changes the training
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // a JobSpec always marshals
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}
