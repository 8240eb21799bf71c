locals {
  intake_bucket   = coalesce(var.intake_bucket, "${var.project_id}-raydrop-intake")
  state_bucket    = coalesce(var.state_bucket, "${var.project_id}-raydrop-state")
  artifact_bucket = coalesce(var.artifact_bucket, "${var.project_id}-raydrop-checkpoints")
  source_bucket   = coalesce(var.source_bucket, "${var.project_id}-raydrop-source")

  cluster_location = var.create_cluster ? var.region : try(var.existing_cluster.location, "")
  cluster_name     = var.create_cluster ? var.cluster_name : try(var.existing_cluster.name, "")
  # The control plane's DNS-based endpoint when it is open to callers
  # outside the VPC (publicly trusted certificate), else its IP endpoint
  # with the cluster's CA: the same choice the functions make
  # (pipeline.GKEEndpoint).
  cluster_dns_endpoint = var.create_cluster ? try(google_container_cluster.raydrop[0].control_plane_endpoints_config[0].dns_endpoint_config[0].endpoint, "") : try(data.google_container_cluster.existing[0].control_plane_endpoints_config[0].dns_endpoint_config[0].endpoint, "")
  cluster_dns_open     = local.cluster_dns_endpoint != "" && (var.create_cluster ? try(google_container_cluster.raydrop[0].control_plane_endpoints_config[0].dns_endpoint_config[0].allow_external_traffic, false) : try(data.google_container_cluster.existing[0].control_plane_endpoints_config[0].dns_endpoint_config[0].allow_external_traffic, false))
  cluster_ip_endpoint  = var.create_cluster ? google_container_cluster.raydrop[0].endpoint : data.google_container_cluster.existing[0].endpoint
  cluster_ip_ca        = var.create_cluster ? google_container_cluster.raydrop[0].master_auth[0].cluster_ca_certificate : data.google_container_cluster.existing[0].master_auth[0].cluster_ca_certificate
  cluster_host         = local.cluster_dns_open ? "https://${local.cluster_dns_endpoint}" : "https://${local.cluster_ip_endpoint}"
  cluster_ca           = local.cluster_dns_open ? null : base64decode(local.cluster_ip_ca)
  gke_cluster          = "projects/${var.project_id}/locations/${local.cluster_location}/clusters/${local.cluster_name}"

  # Every API the deployment and the functions call. A fresh project has
  # only a few on; Service Usage itself is on in every project.
  services = [
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudfunctions.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "compute.googleapis.com",
    "containerfilesystem.googleapis.com", # image streaming (image.tf)
    "container.googleapis.com",
    "eventarc.googleapis.com",
    "eventarcpublishing.googleapis.com", # the message bus (bus.tf)
    "iam.googleapis.com",
    "iamcredentials.googleapis.com",
    "logging.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "storage.googleapis.com",
  ]

  pubsub_agent = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-pubsub.iam.gserviceaccount.com"
}

data "google_project" "this" {
  project_id = var.project_id
}

resource "google_project_service" "services" {
  for_each           = toset(local.services)
  service            = each.value
  disable_on_destroy = false
}

# ---------------------------------------------------------------- buckets

resource "google_storage_bucket" "intake" {
  name                        = local.intake_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy_buckets
  depends_on                  = [google_project_service.services]
}

# Nothing listens to the state bucket: the pipeline's own writes (several
# per run) wake no function.
resource "google_storage_bucket" "state" {
  name                        = local.state_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy_buckets
  depends_on                  = [google_project_service.services]
}

resource "google_storage_bucket" "artifacts" {
  name                        = local.artifact_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = var.force_destroy_buckets
  depends_on                  = [google_project_service.services]
}

resource "google_storage_bucket" "source" {
  name                        = local.source_bucket
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = true
  depends_on                  = [google_project_service.services]
}

# Storage triggers reach Eventarc through Pub/Sub published by the Cloud
# Storage service agent.
data "google_storage_project_service_account" "gcs" {
  depends_on = [google_project_service.services]
}

resource "google_project_iam_member" "gcs_agent_publisher" {
  project = var.project_id
  role    = "roles/pubsub.publisher"
  member  = "serviceAccount:${data.google_storage_project_service_account.gcs.email_address}"
}

# The checkpoint bucket announces only the trainer's mark notices
# (raydrop-marks/<run>/attempt-<n>.json, written after the completion mark)
# to the marks topic, which Monitor's trigger reads: a notification's
# object-name prefix filters before anything is delivered, so the many
# checkpoint files a run writes wake no function. An Eventarc Cloud Storage
# trigger filters by bucket only.
# https://cloud.google.com/storage/docs/pubsub-notifications
resource "google_storage_notification" "marks" {
  bucket             = google_storage_bucket.artifacts.name
  payload_format     = "JSON_API_V1"
  topic              = google_pubsub_topic.topics["marks"].id
  event_types        = ["OBJECT_FINALIZE"]
  object_name_prefix = "raydrop-marks/"
  # Creating it checks that the Cloud Storage agent may publish: wait for
  # the grant to propagate (bootstrap.tf).
  depends_on = [terraform_data.iam_propagation]
}

# The same notification on every extra checkpoint bucket.
resource "google_storage_notification" "marks_extra" {
  for_each           = toset(var.extra_checkpoint_buckets)
  bucket             = each.value
  payload_format     = "JSON_API_V1"
  topic              = google_pubsub_topic.topics["marks"].id
  event_types        = ["OBJECT_FINALIZE"]
  object_name_prefix = "raydrop-marks/"
  depends_on         = [terraform_data.iam_propagation]
}

# ----------------------------------------------------------------- topics

resource "google_pubsub_topic" "topics" {
  for_each   = var.topics
  name       = each.value
  depends_on = [google_project_service.services]
}

# Every trigger gets a dead-letter topic, and a pull subscription on it that
# keeps what landed there for a week so it can be inspected and replayed.
resource "google_pubsub_topic" "dead_letter" {
  for_each   = local.triggers
  name       = "raydrop-${each.key}-dead-letter"
  depends_on = [google_project_service.services]
}

resource "google_pubsub_subscription" "dead_letter" {
  for_each                   = local.triggers
  name                       = "raydrop-${each.key}-dead-letter"
  topic                      = google_pubsub_topic.dead_letter[each.key].id
  message_retention_duration = "604800s"
  expiration_policy {
    ttl = ""
  }
}

# Pub/Sub forwards undeliverable messages as its service agent.
resource "google_pubsub_topic_iam_member" "dead_letter_publisher" {
  for_each   = local.triggers
  topic      = google_pubsub_topic.dead_letter[each.key].id
  role       = "roles/pubsub.publisher"
  member     = local.pubsub_agent
  depends_on = [terraform_data.service_agents]
}

# --------------------------------------------------------------- scheduler

resource "google_cloud_scheduler_job" "ticks" {
  name     = "raydrop-ticks"
  region   = var.region
  schedule = var.tick_schedule

  pubsub_target {
    topic_name = google_pubsub_topic.topics["ticks"].id
    data       = base64encode("tick") # Monitor ignores the data: a tick is a sweep
  }

  depends_on = [google_project_service.services]
}

# ------------------------------------------------- the Hugging Face token

resource "google_secret_manager_secret" "hf_token" {
  secret_id = "raydrop-hf-token"
  replication {
    auto {}
  }
  depends_on = [google_project_service.services]
}

resource "google_secret_manager_secret_version" "hf_token" {
  secret      = google_secret_manager_secret.hf_token.id
  secret_data = var.hf_token
}
