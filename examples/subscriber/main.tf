# The example subscriber as a Cloud Run function of its own: an Eventarc
# trigger on raydrop's public events topic delivers every event to
# PromoteAdapter, which promotes each succeeded run's best adapter to
# gs://<destination_bucket>/<prefix>/<name>/latest/. Self-contained (its own
# providers and variables): apply it beside the raydrop deployment, not
# inside it. README.md says how.

terraform {
  required_version = ">= 1.6.0"

  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 6.40.0"
    }
    archive = {
      source  = "hashicorp/archive"
      version = ">= 2.4.0"
    }
  }
}

provider "google" {
  project = var.project_id
  region  = var.region
}

# ------------------------------------------------------------ variables

variable "project_id" {
  description = "The project of the raydrop deployment, whose events topic the trigger listens to."
  type        = string
}

variable "region" {
  description = "Region of the function and its trigger."
  type        = string
  default     = "us-central1"
}

variable "topic" {
  description = "raydrop's public events topic: its name in var.project_id (var.topics.events of the raydrop deployment) or its full ID, projects/P/topics/T."
  type        = string
  default     = "raydrop-events"
}

variable "checkpoint_bucket" {
  description = "The bucket raydrop's runs write their checkpoints to; the function only reads it."
  type        = string
}

variable "destination_bucket" {
  description = "An existing bucket that receives the promoted adapters (SUBSCRIBER_BUCKET)."
  type        = string
}

variable "prefix" {
  description = "The folder of the promotions in the destination bucket: <prefix>/<name>/latest/ (SUBSCRIBER_PREFIX)."
  type        = string
  default     = "models"
}

variable "source_bucket" {
  description = "An existing bucket for the function's source archive (the raydrop deployment's <project>-raydrop-source will do)."
  type        = string
}

variable "source_dir" {
  description = "The Go module to deploy, whose root package is the subscriber (README.md, \"Deploy\"); default: this folder."
  type        = string
  default     = ""
}

variable "name" {
  description = "Name of the function, its trigger and (with -build) its service accounts."
  type        = string
  default     = "raydrop-subscriber"
  validation {
    condition     = can(regex("^[a-z][-a-z0-9]{4,22}[a-z0-9]$", var.name))
    error_message = "name must be 6 to 24 lower-case letters, digits and '-', starting with a letter and ending with a letter or digit: it is a service account ID (6 to 30 characters), and one more gets \"-build\" added."
  }
}

variable "max_instances" {
  description = "Maximum instances of the function."
  type        = number
  default     = 5
}

variable "concurrency" {
  description = "Events one instance handles at once (the handler is safe for concurrent events; Cloud Run needs a whole CPU per instance for more than one)."
  type        = number
  default     = 8
}

locals {
  topic      = startswith(var.topic, "projects/") ? var.topic : "projects/${var.project_id}/topics/${var.topic}"
  source_dir = var.source_dir != "" ? var.source_dir : path.module
}

# --------------------------------------------------------------- source

# The Go buildpack builds the package at the root of the uploaded module;
# the tests, this configuration and its own files stay out.
data "archive_file" "source" {
  type        = "zip"
  source_dir  = local.source_dir
  output_path = "${path.module}/.build/${var.name}-source.zip"
  excludes = [
    "**/*_test.go", "**/testdata/**", "cmd/**", "**/*.md",
    "**/*.tf", "**/*.tfvars", "**/*.tfstate*", ".terraform/**", ".terraform.lock.hcl", ".build/**",
  ]
}

resource "google_storage_bucket_object" "source" {
  name   = "${var.name}-${data.archive_file.source.output_sha256}.zip"
  bucket = var.source_bucket
  source = data.archive_file.source.output_path
}

# ----------------------------------------------------------- identities

resource "google_service_account" "function" {
  account_id   = var.name
  display_name = "raydrop subscriber: PromoteAdapter"
}

resource "google_service_account" "build" {
  account_id   = "${var.name}-build"
  display_name = "raydrop subscriber build"
}

resource "google_project_iam_member" "build" {
  project = var.project_id
  role    = "roles/cloudbuild.builds.builder"
  member  = google_service_account.build.member
}

# It reads checkpoints, and writes (and, replacing latest/, overwrites,
# which is a delete) only in its own bucket.
resource "google_storage_bucket_iam_member" "checkpoint_viewer" {
  bucket = var.checkpoint_bucket
  role   = "roles/storage.objectViewer"
  member = google_service_account.function.member
}

resource "google_storage_bucket_iam_member" "destination_admin" {
  bucket = var.destination_bucket
  role   = "roles/storage.objectAdmin"
  member = google_service_account.function.member
}

# The function's service account is also its trigger's identity: it
# receives the events and invokes the function.
resource "google_project_iam_member" "event_receiver" {
  project = var.project_id
  role    = "roles/eventarc.eventReceiver"
  member  = google_service_account.function.member
}

resource "google_cloud_run_v2_service_iam_member" "invoker" {
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.subscriber.name
  role     = "roles/run.invoker"
  member   = google_service_account.function.member
}

# A fresh grant takes a while to reach every service; creating the trigger
# (which checks its identity's roles) and the first build wait for them.
resource "terraform_data" "iam_propagation" {
  triggers_replace = [
    google_project_iam_member.build.id,
    google_project_iam_member.event_receiver.id,
    google_storage_bucket_iam_member.checkpoint_viewer.id,
    google_storage_bucket_iam_member.destination_admin.id,
  ]

  provisioner "local-exec" {
    command = "echo 'waiting 120 s for the IAM grants to propagate' && sleep 120"
  }
}

# -------------------------------------------------------------- function

resource "google_cloudfunctions2_function" "subscriber" {
  name        = var.name
  location    = var.region
  description = "Promotes the best adapter of each succeeded raydrop run to gs://${var.destination_bucket}/${var.prefix}/<name>/latest/"

  build_config {
    runtime         = "go126"
    entry_point     = "PromoteAdapter"
    service_account = google_service_account.build.id
    # Cloud Storage's JSON API only, as raydrop's own functions: the
    # documented build tag leaves the client's gRPC dependencies out.
    environment_variables = {
      GOFLAGS = "-tags=disable_grpc_modules"
    }
    source {
      storage_source {
        bucket = var.source_bucket
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    available_memory                 = "256Mi"
    available_cpu                    = "1"
    timeout_seconds                  = 540
    max_instance_count               = var.max_instances
    max_instance_request_concurrency = var.concurrency
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    service_account_email            = google_service_account.function.email
    environment_variables = {
      SUBSCRIBER_BUCKET = var.destination_bucket
      SUBSCRIBER_PREFIX = var.prefix
    }
  }

  # Every message on the topic, as google.cloud.pubsub.topic.v1.messagePublished;
  # the function acts on dev.raydrop.run.v1.succeeded and acknowledges the
  # rest. It fails a delivery only for a transient error, so retrying is
  # safe, and each retry is idempotent.
  event_trigger {
    trigger_region        = var.region
    event_type            = "google.cloud.pubsub.topic.v1.messagePublished"
    pubsub_topic          = local.topic
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.function.email
  }

  depends_on = [terraform_data.iam_propagation]
}

# --------------------------------------------------------------- outputs

output "function" {
  description = "The deployed function."
  value       = google_cloudfunctions2_function.subscriber.name
}

output "trigger" {
  description = "The Eventarc trigger (its Pub/Sub subscription takes a dead-letter policy, README.md)."
  value       = google_cloudfunctions2_function.subscriber.event_trigger[0].trigger
}

output "latest" {
  description = "Where promoted adapters land: <this>/<name>/latest/."
  value       = "gs://${var.destination_bucket}/${trimsuffix(var.prefix, "/")}"
}
