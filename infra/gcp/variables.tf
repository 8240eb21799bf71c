variable "project_id" {
  description = "The existing Google Cloud project to deploy into."
  type        = string
}

variable "region" {
  description = "Region of the buckets, functions, scheduler job and GKE cluster. Storage triggers must be in the bucket's location, so everything lives here; pick one where your B200 (A4) reservation is."
  type        = string
  default     = "us-central1"
}

variable "hf_token" {
  description = "Hugging Face token that may download the model (Gemma 3 needs its license accepted). Kept in Secret Manager and exposed to Ray pods as the Kubernetes Secret hf-secret, key hf_api_token. Never output."
  type        = string
  sensitive   = true
}

variable "reservation" {
  description = "Compute Engine reservation holding the B200 (A4) nodes; job specs name it in cluster.reservation. Informational here: Autopilot places the GPU pods on it through node selectors."
  type        = string
  default     = "b200-reservation"
}

variable "create_cluster" {
  description = "Create a GKE Autopilot cluster with the Ray operator add-on. Set false to use an existing cluster (existing_cluster)."
  type        = bool
  default     = true
}

variable "cluster_name" {
  description = "Name of the GKE cluster to create (the RayClusters that jobs name live inside it)."
  type        = string
  default     = "raydrop"
}

variable "existing_cluster" {
  description = "When create_cluster is false: the existing cluster, with the Ray operator add-on and Workload Identity enabled."
  type = object({
    name     = string
    location = string
  })
  default = null

  validation {
    condition     = var.existing_cluster == null || try(length(var.existing_cluster.name) > 0 && length(var.existing_cluster.location) > 0, false)
    error_message = "existing_cluster needs a name and a location."
  }
}

variable "cluster_deletion_protection" {
  description = "Protect the created cluster against deletion (make destroy then stops at the cluster)."
  type        = bool
  default     = false
}

variable "namespace" {
  description = "Kubernetes namespace of the RayClusters and RayJobs (the job spec's cluster.namespace, default \"default\"). Created unless it is \"default\"."
  type        = string
  default     = "default"
}

variable "data_buckets" {
  description = "Existing Cloud Storage buckets runs may read their data from (a job spec's dataset.source, gs://BUCKET/folder). The Ray pods' identity gets read-only access to each; a spec naming any other bucket is rejected at admission."
  type        = list(string)
  default     = []
}

variable "ray_service_account" {
  description = "Kubernetes service account of the Ray pods (the job spec's cluster.serviceAccount), bound by Workload Identity to a Google service account that may write the artifact bucket."
  type        = string
  default     = "ray-sa"
}

variable "intake_bucket" {
  description = "Intake bucket: job specs (jobs/) and cancellations (cancel/) users drop. Empty: <project_id>-raydrop-intake."
  type        = string
  default     = ""
}

variable "state_bucket" {
  description = "State bucket: run records (runs/) and cluster leases (clusters/), where no trigger listens. Empty: <project_id>-raydrop-state."
  type        = string
  default     = ""
}

variable "artifact_bucket" {
  description = "Checkpoint bucket (the job spec's output.bucket). Empty: <project_id>-raydrop-checkpoints."
  type        = string
  default     = ""
}

variable "extra_checkpoint_buckets" {
  description = "Existing Cloud Storage buckets runs may write checkpoints to besides artifact_bucket (a job spec's output.bucket). Each gets the same grants and mark-notice notification as artifact_bucket. In this project: their notifications publish as this project's Cloud Storage agent."
  type        = list(string)
  default     = []
}

variable "source_bucket" {
  description = "Bucket holding the functions' source archive. Empty: <project_id>-raydrop-source."
  type        = string
  default     = ""
}

variable "force_destroy_buckets" {
  description = "Let make destroy delete buckets that still hold objects (run records, checkpoints)."
  type        = bool
  default     = false
}

variable "topics" {
  description = "Pub/Sub topic names (the functions' RAYDROP_TOPIC_* variables)."
  type = object({
    requests    = optional(string, "raydrop-requests")
    provisioned = optional(string, "raydrop-provisioned")
    submitted   = optional(string, "raydrop-submitted")
    ticks       = optional(string, "raydrop-ticks")
    finished    = optional(string, "raydrop-finished")
    events      = optional(string, "raydrop-events")
    marks       = optional(string, "raydrop-marks")
  })
  default = {}
}

variable "max_delivery_attempts" {
  description = "Deliveries of one event before its trigger's subscription moves it to the trigger's dead-letter topic (5 to 100)."
  type        = number
  default     = 10

  validation {
    condition     = var.max_delivery_attempts >= 5 && var.max_delivery_attempts <= 100
    error_message = "max_delivery_attempts must be between 5 and 100."
  }
}

variable "tick_schedule" {
  description = "Cron schedule of the Cloud Scheduler job publishing to the ticks topic."
  type        = string
  default     = "* * * * *"
}

variable "function_max_instances" {
  description = "Maximum instances of each deployed function (one per trigger)."
  type        = number
  default     = 10
}

variable "function_concurrency" {
  description = "Requests one function instance serves at once (the handlers are safe for concurrent events; Cloud Run needs a whole CPU per instance for more than one)."
  type        = number
  default     = 16
  validation {
    condition     = var.function_concurrency >= 1 && var.function_concurrency <= 1000
    error_message = "function_concurrency must be between 1 and 1000 (Cloud Run's limit)."
  }
}

variable "event_bus" {
  description = "Create an Eventarc Advanced message bus (raydrop-events) that receives every public event too (bus.tf)."
  type        = bool
  default     = false
}

variable "event_bus_destination" {
  description = "With event_bus: an HTTPS endpoint that an example enrollment sends every succeeded event to. Empty: no enrollment."
  type        = string
  default     = ""
}

variable "event_bus_destination_auth" {
  description = "With event_bus_destination: sign the pipeline's requests with a Google OIDC token of its own service account (raydrop-bus-delivery), as an authenticated Cloud Run service needs. false: send no credentials (a public endpoint)."
  type        = bool
  default     = true
}

variable "event_bus_destination_service" {
  description = "With event_bus_destination_auth: the Cloud Run service behind event_bus_destination, on which the pipeline's account gets roles/run.invoker. null: grant it yourself (output event_bus_delivery_account)."
  type = object({
    name     = string
    location = string
  })
  default = null
}

variable "event_bus_network_attachment" {
  description = "With event_bus_destination: a network attachment (projects/P/regions/R/networkAttachments/N) through which the pipeline reaches a destination only a VPC network can reach. Empty: the destination is reached over its public address."
  type        = string
  default     = ""
}

variable "env" {
  description = "Extra environment variables for every function (RAYDROP_SCALE_DOWN_GRACE, RAYDROP_GPU_HOUR_USD, RAYDROP_EVENT_SOURCE, RAYDROP_EVIDENCE_BUDGET, RAYDROP_EVIDENCE_LOG_CAP)."
  type        = map(string)
  default     = {}
}

variable "source_dir" {
  description = "The repository root, zipped as the functions' source with .gcloudignore's excludes. Empty: two levels above this folder."
  type        = string
  default     = ""
}

variable "build_trainer_image" {
  description = "Build trainer/image with Cloud Build into Artifact Registry (image.tf) and make it the image of every Ray container a spec names none for. false (and no trainer_image): the stock Ray images, each run pip-installing the trainer's requirements on every node."
  type        = bool
  default     = true
}

variable "trainer_image" {
  description = "A trainer image built elsewhere from trainer/image, by digest (repository@sha256:<64 hex>), used instead of building one. Empty: build_trainer_image decides."
  type        = string
  default     = ""

  validation {
    condition     = var.trainer_image == "" || can(regex("^[a-z0-9][a-z0-9./_:-]*@sha256:[0-9a-f]{64}$", var.trainer_image))
    error_message = "trainer_image must name its image by digest: repository@sha256:<64 hex digits> (a tag can move under a running run)."
  }
}

variable "trainer_image_repository" {
  description = "The Artifact Registry repository (in var.region) the trainer image is built into."
  type        = string
  default     = "raydrop"

  validation {
    condition     = can(regex("^[a-z]([a-z0-9-]{0,61}[a-z0-9])?$", var.trainer_image_repository))
    error_message = "trainer_image_repository must be a repository ID: lower-case letters, digits and hyphens, starting with a letter, at most 63 characters."
  }
}

variable "node_service_account" {
  description = "The email of the service account the cluster's nodes run as, which pulls the trainer image. Empty: the Compute Engine default service account, Autopilot's default."
  type        = string
  default     = ""
}

variable "stage_models" {
  description = "Stage each base model revision once in the checkpoint bucket (gs://<artifacts>/models/<repo>/<commit>), copied from the Hub by the first run that needs it; every later run and node reads it from there. False: every node of every run downloads the model from the Hub."
  type        = bool
  default     = true
}
