# The GKE Autopilot cluster with the Ray operator add-on, or an existing one.
# GPU nodes come from the capacity tiers each job spec lists (cluster.capacity:
# a reservation, flex-start, Spot): Autopilot provisions a node for each pod
# from its node selector, so no node pool, compute class or GPU is declared
# here. Reservations:
# https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations;
# Spot Pods: https://cloud.google.com/kubernetes-engine/docs/how-to/autopilot-spot-pods;
# flex-start (its nodes last at most seven days):
# https://cloud.google.com/kubernetes-engine/docs/how-to/dws-flex-start-training.
# Nothing exposes the Ray dashboard: its job API runs code for anyone who
# reaches it, so it stays a cluster-internal Service.

resource "google_container_cluster" "raydrop" {
  count               = var.create_cluster ? 1 : 0
  name                = var.cluster_name
  location            = var.region
  enable_autopilot    = true
  deletion_protection = var.cluster_deletion_protection

  release_channel {
    channel = "REGULAR"
  }

  addons_config {
    ray_operator_config {
      enabled = true
    }
  }

  # The DNS-based control-plane endpoint, open to callers outside the VPC:
  # the functions (Cloud Run, no VPC connector) and this configuration's
  # Kubernetes provider reach the control plane by name, every request
  # checked by IAM, whatever its IP endpoints are.
  # https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation#dns-based-endpoint
  control_plane_endpoints_config {
    dns_endpoint_config {
      allow_external_traffic = true
    }
  }

  depends_on = [google_project_service.services]
}

data "google_container_cluster" "existing" {
  count    = var.create_cluster ? 0 : 1
  name     = try(var.existing_cluster.name, null)
  location = try(var.existing_cluster.location, null)

  lifecycle {
    precondition {
      condition     = var.existing_cluster != null
      error_message = "create_cluster = false needs existing_cluster = { name, location }."
    }
  }
}

# --------------------------------------------- the Ray pods' identity

resource "google_service_account" "ray" {
  account_id   = "raydrop-ray"
  display_name = "raydrop Ray pods (writes checkpoints)"
  depends_on   = [google_project_service.services]
}

resource "google_storage_bucket_iam_member" "ray_artifacts" {
  bucket = google_storage_bucket.artifacts.name
  role   = "roles/storage.objectAdmin"
  member = google_service_account.ray.member
}

# Ray Train creates its experiment and checkpoint folders with
# pyarrow.fs.GcsFileSystem.create_dir (ray/train/_internal/storage.py), and
# Arrow's GCS filesystem reads the bucket's metadata when no folder above
# the path exists yet (GcsFileSystem::Impl::CreateDir calls
# GetBucketMetadata, arrow/cpp/src/arrow/filesystem/gcsfs.cc): that needs
# storage.buckets.get, which roles/storage.objectAdmin does not hold. The
# legacy bucket reader role adds exactly that on this bucket (its other
# permission, storage.objects.list, objectAdmin has already).
# https://cloud.google.com/storage/docs/access-control/iam-roles
resource "google_storage_bucket_iam_member" "ray_artifacts_bucket_metadata" {
  bucket = google_storage_bucket.artifacts.name
  role   = "roles/storage.legacyBucketReader"
  member = google_service_account.ray.member
}

# Every extra checkpoint bucket, as the one above.
resource "google_storage_bucket_iam_member" "ray_extra_artifacts" {
  for_each = toset(var.extra_checkpoint_buckets)
  bucket   = each.value
  role     = "roles/storage.objectAdmin"
  member   = google_service_account.ray.member
}

resource "google_storage_bucket_iam_member" "ray_extra_artifacts_bucket_metadata" {
  for_each = toset(var.extra_checkpoint_buckets)
  bucket   = each.value
  role     = "roles/storage.legacyBucketReader"
  member   = google_service_account.ray.member
}

# The buckets runs read their data from (a spec's dataset.source): read-only,
# and to the Ray pods alone; the functions only check a spec names one of
# them (RAYDROP_DATA_BUCKETS). objectViewer lists and reads objects.
# https://cloud.google.com/storage/docs/access-control/iam-roles
resource "google_storage_bucket_iam_member" "ray_data" {
  for_each = toset(var.data_buckets)
  bucket   = each.value
  role     = "roles/storage.objectViewer"
  member   = google_service_account.ray.member
}

resource "google_service_account_iam_member" "ray_workload_identity" {
  service_account_id = google_service_account.ray.name
  role               = "roles/iam.workloadIdentityUser"
  member             = "serviceAccount:${var.project_id}.svc.id.goog[${var.namespace}/${var.ray_service_account}]"
  # The identity pool exists once the cluster does.
  depends_on = [google_container_cluster.raydrop]
}

# ------------------------------------------------ Kubernetes objects

resource "kubernetes_namespace_v1" "raydrop" {
  count = var.namespace == "default" ? 0 : 1
  metadata {
    name = var.namespace
  }
}

resource "kubernetes_service_account_v1" "ray" {
  metadata {
    name      = var.ray_service_account
    namespace = var.namespace
    annotations = {
      "iam.gke.io/gcp-service-account" = google_service_account.ray.email
    }
  }
  depends_on = [kubernetes_namespace_v1.raydrop]
}

# The token from Secret Manager, as the Secret the job spec references
# (hf-secret / hf_api_token); never in a runtime env or an output.
resource "kubernetes_secret_v1" "hf" {
  metadata {
    name      = "hf-secret"
    namespace = var.namespace
  }
  data = {
    hf_api_token = google_secret_manager_secret_version.hf_token.secret_data
  }
  type       = "Opaque"
  depends_on = [kubernetes_namespace_v1.raydrop]
}
