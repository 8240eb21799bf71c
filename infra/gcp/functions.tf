# The four functions, deployed from the repository root with their entry
# points (the Go buildpack serves only functions registered by the root
# package). A 2nd gen function has one trigger, so a function with several
# triggers is deployed once per trigger, as the local cloud routes them.

locals {
  # What each function does, and so what its service account may do: the
  # topics it publishes to, whether it reads the checkpoint bucket, and its
  # Kubernetes verbs per resource (its Role in var.namespace; kube_cluster:
  # a ClusterRole's, read-only). The same
  # table as pkg/wiring/wiring.go; a test checks one against the other.
  functions = {
    provision = {
      entry_point     = "Provision"
      publishes       = ["provisioned", "submitted", "events"]
      reads_artifacts = true
      writes_reports  = false
      kube = {
        configmaps  = ["create"]
        rayclusters = ["create", "get", "update"]
      }
      kube_cluster = {}
    }
    submit = {
      entry_point     = "Submit"
      publishes       = ["submitted", "finished"]
      reads_artifacts = true
      writes_reports  = false
      kube = {
        rayjobs = ["create"]
      }
      kube_cluster = {}
    }
    monitor = {
      entry_point     = "Monitor"
      publishes       = ["provisioned", "finished", "events"]
      reads_artifacts = true
      writes_reports  = true
      kube = {
        configmaps  = ["create"]
        events      = ["list"]
        pods        = ["delete", "list"]
        "pods/log"  = ["get"]
        rayclusters = ["create", "get", "list", "update"]
        rayjobs     = ["delete", "get", "list"]
      }
      kube_cluster = {
        nodes = ["get"]
      }
    }
    finalize = {
      entry_point     = "Finalize"
      publishes       = ["provisioned", "events"]
      reads_artifacts = true
      writes_reports  = true
      kube = {
        configmaps  = ["create"]
        events      = ["list"]
        pods        = ["list"]
        "pods/log"  = ["get"]
        rayclusters = ["create", "get", "update"]
        rayjobs     = ["delete"]
      }
      kube_cluster = {
        nodes = ["get"]
      }
    }
  }

  # The API group of each resource in the functions' kube tables.
  kube_api_groups = {
    configmaps  = ""
    events      = ""
    pods        = ""
    "pods/log"  = ""
    nodes       = ""
    rayclusters = "ray.io"
    rayjobs     = "ray.io"
  }

  # One deployed function per trigger: the same routes as the local cloud.
  triggers = {
    provision-intake   = { function = "provision", topic = null, bucket = "intake" }
    provision-requests = { function = "provision", topic = "requests", bucket = null }
    submit             = { function = "submit", topic = "provisioned", bucket = null }
    monitor-submitted  = { function = "monitor", topic = "submitted", bucket = null }
    monitor-ticks      = { function = "monitor", topic = "ticks", bucket = null }
    monitor-marks      = { function = "monitor", topic = "marks", bucket = null }
    finalize           = { function = "finalize", topic = "finished", bucket = null }
  }

  bucket_names = {
    intake = google_storage_bucket.intake.name
  }

  publisher_bindings = merge([
    for fn, f in local.functions : {
      for t in f.publishes : "${fn}/${t}" => { function = fn, topic = t }
    }
  ]...)

  function_env = merge(var.env, {
    RAYDROP_PROJECT           = var.project_id
    RAYDROP_INTAKE_BUCKET     = google_storage_bucket.intake.name
    RAYDROP_STATE_BUCKET      = google_storage_bucket.state.name
    RAYDROP_OUTPUT_BUCKETS    = join(",", concat([google_storage_bucket.artifacts.name], var.extra_checkpoint_buckets))
    RAYDROP_DATA_BUCKETS      = join(",", var.data_buckets)
    RAYDROP_NAMESPACES        = var.namespace
    RAYDROP_GKE_CLUSTER       = local.gke_cluster
    RAYDROP_TOPIC_REQUESTS    = var.topics.requests
    RAYDROP_TOPIC_PROVISIONED = var.topics.provisioned
    RAYDROP_TOPIC_SUBMITTED   = var.topics.submitted
    RAYDROP_TOPIC_TICKS       = var.topics.ticks
    RAYDROP_TOPIC_FINISHED    = var.topics.finished
    RAYDROP_TOPIC_EVENTS      = var.topics.events
    RAYDROP_TOPIC_MARKS       = var.topics.marks
    RAYDROP_EVENT_BUS         = var.event_bus ? google_eventarc_message_bus.events[0].id : ""
    RAYDROP_TRAINER_IMAGE     = local.trainer_image
    # Base models staged once per revision beside the checkpoints, which
    # the Ray pods write and the functions read (pkg/weights).
    RAYDROP_MODEL_STAGING = var.stage_models ? "gs://${google_storage_bucket.artifacts.name}/models" : ""
  })

  # .gcloudignore, read as the archive's excludes. A pattern without a slash
  # matches at any depth (as in .gcloudignore), hence the "**/" prefix.
  source_dir = var.source_dir != "" ? var.source_dir : "${path.module}/../.."
  gcloudignore = [
    for l in split("\n", file("${local.source_dir}/.gcloudignore")) : trimspace(l)
    if trimspace(l) != "" && !startswith(trimspace(l), "#")
  ]
  source_excludes = [
    for p in local.gcloudignore : (
      length(regexall("/", trimsuffix(p, "/"))) > 0 ? trimsuffix(p, "/") : "**/${trimsuffix(p, "/")}"
    )
  ]
}

data "archive_file" "source" {
  type        = "zip"
  source_dir  = local.source_dir
  output_path = "${path.module}/.build/raydrop-source.zip"
  excludes    = local.source_excludes

  lifecycle {
    precondition {
      condition     = alltrue([for p in local.gcloudignore : !startswith(p, "!")])
      error_message = ".gcloudignore has a negated (!) pattern, which the archive's excludes cannot honour."
    }
  }
}

resource "google_storage_bucket_object" "source" {
  name   = "raydrop-${data.archive_file.source.output_sha256}.zip"
  bucket = google_storage_bucket.source.name
  source = data.archive_file.source.output_path
}

# ---------------------------------------------------------- identities

resource "google_service_account" "function" {
  for_each     = local.functions
  account_id   = "raydrop-${each.key}"
  display_name = "raydrop ${each.value.entry_point} function"
  depends_on   = [google_project_service.services]
}

# The functions read the Hub token (HF_TOKEN, above).
resource "google_secret_manager_secret_iam_member" "function_hf_token" {
  for_each  = local.functions
  secret_id = google_secret_manager_secret.hf_token.id
  role      = "roles/secretmanager.secretAccessor"
  member    = "serviceAccount:${google_service_account.function[each.key].email}"
}

resource "google_service_account" "build" {
  account_id   = "raydrop-build"
  display_name = "raydrop functions build"
  depends_on   = [google_project_service.services]
}

resource "google_project_iam_member" "build" {
  project = var.project_id
  role    = "roles/cloudbuild.builds.builder"
  member  = google_service_account.build.member
}

# Every function keeps its records and leases in the state bucket; only
# the function the intake bucket triggers reads it (pipeline.Function.ReadsIntake).
resource "google_storage_bucket_iam_member" "state_admin" {
  for_each = local.functions
  bucket   = google_storage_bucket.state.name
  role     = "roles/storage.objectAdmin"
  member   = google_service_account.function[each.key].member
}

resource "google_storage_bucket_iam_member" "intake_viewer" {
  for_each = toset(distinct([for t in local.triggers : t.function if t.bucket == "intake"]))
  bucket   = google_storage_bucket.intake.name
  role     = "roles/storage.objectViewer"
  member   = google_service_account.function[each.key].member
}

resource "google_storage_bucket_iam_member" "artifacts_viewer" {
  for_each = { for k, f in local.functions : k => f if f.reads_artifacts }
  bucket   = google_storage_bucket.artifacts.name
  role     = "roles/storage.objectViewer"
  member   = google_service_account.function[each.key].member
}

# Finalize writes each run's report beside its checkpoints. objectCreator
# creates objects and cannot replace or delete one; finalize creates the
# report under the precondition that none exists (ifGenerationMatch=0).
# https://cloud.google.com/storage/docs/access-control/iam-roles
resource "google_storage_bucket_iam_member" "artifacts_report_creator" {
  for_each = { for k, f in local.functions : k => f if f.writes_reports }
  bucket   = google_storage_bucket.artifacts.name
  role     = "roles/storage.objectCreator"
  member   = google_service_account.function[each.key].member
}

# The same two grants on every extra checkpoint bucket (var.extra_checkpoint_buckets).
resource "google_storage_bucket_iam_member" "extra_artifacts_viewer" {
  for_each = merge([for k, f in local.functions : { for b in var.extra_checkpoint_buckets : "${k}/${b}" => { function = k, bucket = b } } if f.reads_artifacts]...)
  bucket   = each.value.bucket
  role     = "roles/storage.objectViewer"
  member   = google_service_account.function[each.value.function].member
}

resource "google_storage_bucket_iam_member" "extra_artifacts_report_creator" {
  for_each = merge([for k, f in local.functions : { for b in var.extra_checkpoint_buckets : "${k}/${b}" => { function = k, bucket = b } } if f.writes_reports]...)
  bucket   = each.value.bucket
  role     = "roles/storage.objectCreator"
  member   = google_service_account.function[each.value.function].member
}

resource "google_pubsub_topic_iam_member" "publisher" {
  for_each = local.publisher_bindings
  topic    = google_pubsub_topic.topics[each.value.topic].id
  role     = "roles/pubsub.publisher"
  member   = google_service_account.function[each.value.function].member
}

# GKE: finding the cluster (its endpoints) and reaching its control plane
# is all IAM grants a function. What it may do inside the cluster is its
# Role below, in the runs' namespace only: IAM and RBAC are additive on
# GKE, so no project-wide Kubernetes role (roles/container.developer would
# allow every namespace and every Secret) is granted.
# https://cloud.google.com/kubernetes-engine/docs/how-to/iam#interaction_with_rbac
#
# The DNS-based endpoint lets a request through only when its caller holds
# container.clusters.connect on the cluster
# (https://cloud.google.com/kubernetes-engine/docs/concepts/network-isolation).
# roles/container.clusterViewer holds container.clusters.connect,
# container.clusters.get and .list (and resourcemanager.projects.get, .list)
# and nothing inside the cluster: the narrowest predefined role with both
# (https://cloud.google.com/iam/docs/roles-permissions/container; the
# permission list as `gcloud iam roles describe roles/container.clusterViewer`
# returns it, mirrored in github.com/iann0036/iam-dataset,
# gcp/roles/container.clusterViewer.json, whose older snapshots lack
# connect: it was added to the role later).
resource "google_project_iam_member" "cluster_viewer" {
  for_each = local.functions
  project  = var.project_id
  role     = "roles/container.clusterViewer"
  member   = google_service_account.function[each.key].member
}

# Each function's Kubernetes verbs (local.functions[*].kube), bound to its
# Google service account, which GKE authenticates under its email.
# https://cloud.google.com/kubernetes-engine/docs/how-to/role-based-access-control#rolebinding
resource "kubernetes_role_v1" "function" {
  for_each = local.functions
  metadata {
    name      = "raydrop-${each.key}"
    namespace = var.namespace
  }
  dynamic "rule" {
    for_each = each.value.kube
    content {
      api_groups = [local.kube_api_groups[rule.key]]
      resources  = [rule.key]
      verbs      = rule.value
    }
  }
  depends_on = [kubernetes_namespace_v1.raydrop]
}

resource "kubernetes_role_binding_v1" "function" {
  for_each = local.functions
  metadata {
    name      = "raydrop-${each.key}"
    namespace = var.namespace
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "Role"
    name      = kubernetes_role_v1.function[each.key].metadata[0].name
  }
  subject {
    api_group = "rbac.authorization.k8s.io"
    kind      = "User"
    name      = google_service_account.function[each.key].email
  }
}

# The cluster-scoped reads of the functions that keep a run's evidence
# (local.functions[*].kube_cluster: get on nodes, their labels and
# conditions), as a ClusterRole bound to the function's service account.
resource "kubernetes_cluster_role_v1" "function" {
  for_each = { for fn, f in local.functions : fn => f if length(f.kube_cluster) > 0 }
  metadata {
    name = "raydrop-${each.key}"
  }
  dynamic "rule" {
    for_each = each.value.kube_cluster
    content {
      api_groups = [local.kube_api_groups[rule.key]]
      resources  = [rule.key]
      verbs      = rule.value
    }
  }
}

resource "kubernetes_cluster_role_binding_v1" "function" {
  for_each = kubernetes_cluster_role_v1.function
  metadata {
    name = "raydrop-${each.key}"
  }
  role_ref {
    api_group = "rbac.authorization.k8s.io"
    kind      = "ClusterRole"
    name      = each.value.metadata[0].name
  }
  subject {
    api_group = "rbac.authorization.k8s.io"
    kind      = "User"
    name      = google_service_account.function[each.key].email
  }
}

# Each function's service account is also its triggers' identity.
resource "google_project_iam_member" "event_receiver" {
  for_each = local.functions
  project  = var.project_id
  role     = "roles/eventarc.eventReceiver"
  member   = google_service_account.function[each.key].member
}

resource "google_cloud_run_v2_service_iam_member" "invoker" {
  for_each = local.triggers
  project  = var.project_id
  location = var.region
  name     = google_cloudfunctions2_function.trigger[each.key].name
  role     = "roles/run.invoker"
  member   = google_service_account.function[each.value.function].member
}

# ------------------------------------------------------------ functions

resource "google_cloudfunctions2_function" "trigger" {
  for_each    = local.triggers
  name        = "raydrop-${each.key}"
  location    = var.region
  description = "raydrop ${local.functions[each.value.function].entry_point} (${each.key})"

  build_config {
    runtime         = "go126"
    entry_point     = local.functions[each.value.function].entry_point
    service_account = google_service_account.build.id
    # The functions use Cloud Storage's JSON API: the documented build tag
    # leaves its gRPC/DirectPath dependencies out (146 fewer packages, a
    # 20 MB smaller binary, a faster cold start). The local cloud builds
    # with the same GOFLAGS (infra/localcloud/stack.BuildEnv).
    environment_variables = {
      GOFLAGS = "-tags=disable_grpc_modules"
    }
    source {
      storage_source {
        bucket = google_storage_bucket.source.name
        object = google_storage_bucket_object.source.name
      }
    }
  }

  service_config {
    available_memory   = "512Mi"
    timeout_seconds    = 540
    max_instance_count = var.function_max_instances
    # Many events at once per instance, which Cloud Run allows only with
    # at least one whole CPU:
    # https://cloud.google.com/run/docs/configuring/services/cpu#cpu-memory
    max_instance_request_concurrency = var.function_concurrency
    available_cpu                    = "1"
    ingress_settings                 = "ALLOW_INTERNAL_ONLY"
    service_account_email            = google_service_account.function[each.value.function].email
    environment_variables            = local.function_env
    # The Hub token, for the model revisions of private repositories
    # (submit resolves a revision to its commit).
    secret_environment_variables {
      key        = "HF_TOKEN"
      project_id = var.project_id
      secret     = google_secret_manager_secret.hf_token.secret_id
      version    = "latest"
    }
  }

  event_trigger {
    trigger_region        = var.region
    event_type            = each.value.topic != null ? "google.cloud.pubsub.topic.v1.messagePublished" : "google.cloud.storage.object.v1.finalized"
    pubsub_topic          = each.value.topic != null ? google_pubsub_topic.topics[each.value.topic].id : null
    retry_policy          = "RETRY_POLICY_RETRY"
    service_account_email = google_service_account.function[each.value.function].email

    dynamic "event_filters" {
      for_each = each.value.bucket != null ? [local.bucket_names[each.value.bucket]] : []
      content {
        attribute = "bucket"
        value     = event_filters.value
      }
    }
  }

  depends_on = [
    terraform_data.iam_propagation,
    kubernetes_role_binding_v1.function,
    google_secret_manager_secret_iam_member.function_hf_token,
    google_secret_manager_secret_version.hf_token, # read at "latest"
  ]
}

# Eventarc creates each trigger's Pub/Sub subscription itself, and neither
# the function nor the trigger resource exposes its dead-letter policy; this
# sets it on that subscription once the trigger exists (needs gcloud).
resource "terraform_data" "dead_letter_policy" {
  for_each = local.triggers

  triggers_replace = [
    google_cloudfunctions2_function.trigger[each.key].event_trigger[0].trigger,
    google_pubsub_topic.dead_letter[each.key].id,
    var.max_delivery_attempts,
  ]

  provisioner "local-exec" {
    interpreter = ["bash", "-euo", "pipefail", "-c"]
    command     = <<-EOT
      sub=$(gcloud eventarc triggers describe "$TRIGGER" --format='value(transport.pubsub.subscription)')
      gcloud pubsub subscriptions update "$sub" --dead-letter-topic="$DEAD_LETTER" \
        --max-delivery-attempts="$ATTEMPTS" --min-retry-delay=10s --max-retry-delay=600s
      gcloud pubsub subscriptions add-iam-policy-binding "$sub" \
        --member="$PUBSUB_AGENT" --role=roles/pubsub.subscriber >/dev/null
    EOT
    environment = {
      TRIGGER      = google_cloudfunctions2_function.trigger[each.key].event_trigger[0].trigger
      DEAD_LETTER  = google_pubsub_topic.dead_letter[each.key].id
      ATTEMPTS     = tostring(var.max_delivery_attempts)
      PUBSUB_AGENT = local.pubsub_agent
    }
  }

  depends_on = [google_pubsub_topic_iam_member.dead_letter_publisher, terraform_data.service_agents]
}
