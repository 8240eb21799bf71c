# ------------------------------------------------------ the trainer image
#
# trainer/image built once per change into Artifact Registry: the pinned Ray
# GPU image with the trainer's locked dependencies installed, so that a run
# installs nothing at start-up (the stock image pip-installs torch, TRL and
# the rest on every node, 1-5 minutes each time, against PyPI's uptime).
# The functions get it by digest (RAYDROP_TRAINER_IMAGE): every run records
# exactly what it ran, and a rebuild changes only runs admitted after it.
#
# Pulls: Autopilot streams eligible images from Artifact Registry on its
# own once the Container File System API is on (main.tf's services): a
# container starts before its image is all on the node, which GKE fetches
# in the background and caches for the next pod
# (https://cloud.google.com/kubernetes-engine/docs/how-to/image-streaming).
# The first pull on a node still reads what the trainer imports at start.
# Preloading onto a secondary boot disk
# (https://cloud.google.com/kubernetes-engine/docs/how-to/data-container-image-preloading)
# needs a disk image built apart from this one and a ComputeClass naming
# it; it is not done here (docs/deploying.md says how).

locals {
  trainer_image_dir = "${local.source_dir}/trainer/image"
  # The tag is a hash of what the image is built from: a change of the lock,
  # the script or the Dockerfile builds a new image, anything else none.
  trainer_image_tag = substr(sha256(join(",", [
    for f in sort(fileset(local.trainer_image_dir, "*")) : "${f}:${filesha256("${local.trainer_image_dir}/${f}")}"
  ])), 0, 20)
  trainer_repository = "${var.region}-docker.pkg.dev/${var.project_id}/${var.trainer_image_repository}"
  build_trainer      = var.trainer_image == "" && var.build_trainer_image
  # What the functions run every unnamed image on: the image given, the one
  # built here (by digest), or none (the stock Ray images, with pip).
  trainer_image = (
    var.trainer_image != "" ? var.trainer_image :
    local.build_trainer ? data.google_artifact_registry_docker_image.trainer[0].self_link : ""
  )
  # The nodes pull as the Compute Engine default account unless told
  # otherwise (https://cloud.google.com/artifact-registry/docs/integrate-gke).
  node_account = var.node_service_account != "" ? var.node_service_account : "${data.google_project.this.number}-compute@developer.gserviceaccount.com"
}

resource "google_artifact_registry_repository" "trainer" {
  count         = local.build_trainer ? 1 : 0
  location      = var.region
  repository_id = var.trainer_image_repository
  format        = "DOCKER"
  description   = "raydrop's trainer images (trainer/image)"
  depends_on    = [google_project_service.services]
}

# The GPU nodes pull from it.
resource "google_artifact_registry_repository_iam_member" "nodes_pull" {
  count      = local.build_trainer ? 1 : 0
  location   = var.region
  repository = google_artifact_registry_repository.trainer[0].name
  role       = "roles/artifactregistry.reader"
  member     = "serviceAccount:${local.node_account}"
}

# A node account other than the default one needs Service Usage Consumer
# for image streaming (the image streaming page's requirements).
resource "google_project_iam_member" "nodes_streaming" {
  count   = local.build_trainer && var.node_service_account != "" ? 1 : 0
  project = var.project_id
  role    = "roles/serviceusage.serviceUsageConsumer"
  member  = "serviceAccount:${var.node_service_account}"
}

# The build runs as an account of its own that may push to this repository,
# read its source from the source bucket and write its logs, and nothing
# else.
resource "google_service_account" "image_build" {
  count        = local.build_trainer ? 1 : 0
  account_id   = "raydrop-image-build"
  display_name = "raydrop trainer image build"
}

resource "google_artifact_registry_repository_iam_member" "build_push" {
  count      = local.build_trainer ? 1 : 0
  location   = var.region
  repository = google_artifact_registry_repository.trainer[0].name
  role       = "roles/artifactregistry.writer"
  member     = google_service_account.image_build[0].member
}

resource "google_storage_bucket_iam_member" "build_source" {
  count  = local.build_trainer ? 1 : 0
  bucket = google_storage_bucket.source.name
  role   = "roles/storage.objectViewer"
  member = google_service_account.image_build[0].member
}

resource "google_project_iam_member" "build_logs" {
  count   = local.build_trainer ? 1 : 0
  project = var.project_id
  role    = "roles/logging.logWriter"
  member  = google_service_account.image_build[0].member
}

# gcloud builds submit: the google provider has no resource that runs a
# build and waits for it. It runs again only when the tag changes; the
# image it pushed stays (running runs keep pulling it by digest).
resource "terraform_data" "trainer_build" {
  count            = local.build_trainer ? 1 : 0
  triggers_replace = [local.trainer_image_tag, var.trainer_image_repository]

  provisioner "local-exec" {
    interpreter = ["bash", "-euo", "pipefail", "-c"]
    command     = <<-EOT
      gcloud builds submit "$DIR" --project="$PROJECT" --region="$REGION" \
        --config="$DIR/cloudbuild.yaml" --substitutions="_IMAGE=$IMAGE" \
        --service-account="projects/$PROJECT/serviceAccounts/$ACCOUNT" \
        --gcs-source-staging-dir="gs://$SOURCE_BUCKET/trainer-image-source"
    EOT
    environment = {
      DIR           = local.trainer_image_dir
      PROJECT       = var.project_id
      REGION        = var.region
      IMAGE         = "${local.trainer_repository}/trainer:${local.trainer_image_tag}"
      ACCOUNT       = google_service_account.image_build[0].email
      SOURCE_BUCKET = google_storage_bucket.source.name
    }
  }

  depends_on = [
    google_artifact_registry_repository_iam_member.build_push,
    google_storage_bucket_iam_member.build_source,
    google_project_iam_member.build_logs,
    terraform_data.iam_propagation,
  ]
}

# The built image by digest (self_link: ...@sha256:...).
data "google_artifact_registry_docker_image" "trainer" {
  count         = local.build_trainer ? 1 : 0
  location      = var.region
  repository_id = var.trainer_image_repository
  image_name    = "trainer:${local.trainer_image_tag}"
  depends_on    = [terraform_data.trainer_build]
}
