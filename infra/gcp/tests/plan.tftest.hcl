# The deployment planned offline for the configurations users have, with
# the real google provider (its schemas, validation and plan-time values:
# what it cannot know before apply stays unknown, as in a real plan, so a
# for_each or count over such a value fails here as it would there). Only
# what a real plan reads from Google Cloud is stood in for: the data
# sources (override_data, with values shaped as the API returns them; a
# data source is read during plan, so its values are known there too),
# and the kubernetes and archive providers (mock_provider: their objects
# are leaves, and the archive would zip the whole repository). The access
# token is never used: planning a new resource calls no API.
#
# var.wiring (tests/wiring.auto.tfvars.json, which tofu test loads by
# itself) is pkg/wiring's table as the grants it implies, written
# and kept equal to the table by infra/localcloud/deploycheck.
# Run by make infra-plan (part of make infra-check).

provider "google" {
  project      = "raydrop-test"
  region       = "us-central1"
  access_token = "offline"
}

mock_provider "kubernetes" {}

mock_provider "archive" {
  mock_data "archive_file" {
    defaults = {
      output_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    }
  }
}

override_data {
  target = data.google_project.this
  values = {
    number = "123456789012"
  }
}

override_data {
  target = data.google_storage_project_service_account.gcs
  values = {
    email_address = "service-123456789012@gs-project-accounts.iam.gserviceaccount.com"
  }
}

override_data {
  target = data.google_client_config.default
  values = {
    access_token = "offline"
  }
}

variables {
  project_id = "raydrop-test"
  hf_token   = "hf_test"
  # var.wiring: tests/wiring.auto.tfvars.json
}

# 1. Only the required variables.
run "defaults" {
  command = plan

  assert {
    condition     = length(google_container_cluster.raydrop) == 1 && length(google_eventarc_message_bus.events) == 0
    error_message = "The defaults create the cluster and no event bus."
  }

  assert {
    condition     = toset(keys(google_cloudfunctions2_function.trigger)) == toset(flatten([for fn, f in var.wiring.functions : [for g in f.grants : trimprefix(split("|", g)[0], "run:") if startswith(g, "run:")]]))
    error_message = "The deployed functions are not one per trigger of the wiring table."
  }

  assert {
    condition     = local.function_env.RAYDROP_GKE_CLUSTER == "projects/raydrop-test/locations/us-central1/clusters/raydrop" && local.function_env.RAYDROP_EVENT_BUS == ""
    error_message = "The functions are not pointed at the created cluster: ${local.function_env.RAYDROP_GKE_CLUSTER}"
  }

  # Every grant the wiring table gives each function is in the plan, on the
  # right bucket, topic, service or project, bound to that function's own
  # service account. (A topic binding is known by its key: the topic's ID
  # is unknown until apply.)
  assert {
    condition = length([for want in flatten([for fn, f in var.wiring.functions : [for g in f.grants : "${fn}|${g}"]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)]) == 0
    error_message = "Grants the wiring table needs and the plan lacks (function|target|role): ${join(", ", [for want in flatten([for fn, f in var.wiring.functions : [for g in f.grants : "${fn}|${g}"]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)])}"
  }

  assert {
    condition     = length(google_project_iam_member.bus_publisher) == 0
    error_message = "Without the event bus no function may publish to one."
  }

  # Each function's Role holds exactly its verbs from the wiring table, and
  # its RoleBinding names its own service account and that Role.
  assert {
    condition = alltrue([for fn, f in var.wiring.functions :
      jsonencode({ for r in kubernetes_role_v1.function[fn].rule : one(r.resources) => sort(r.verbs) }) == jsonencode(f.kube)
    ])
    error_message = "A function's Kubernetes Role differs from the wiring table's verbs."
  }

  assert {
    condition = alltrue([for fn, f in var.wiring.functions :
      kubernetes_role_binding_v1.function[fn].subject[0].name == google_service_account.function[fn].email &&
      kubernetes_role_binding_v1.function[fn].role_ref[0].name == kubernetes_role_v1.function[fn].metadata[0].name
    ])
    error_message = "A function's RoleBinding does not bind its own service account to its own Role."
  }

  # A ClusterRole only for the functions whose wiring has cluster-scoped
  # verbs (reading nodes), with exactly those, bound to their own account.
  assert {
    condition = alltrue([for fn, f in var.wiring.functions :
      length(f.kube_cluster) == 0 ? !contains(keys(kubernetes_cluster_role_v1.function), fn) : try(
        jsonencode({ for r in kubernetes_cluster_role_v1.function[fn].rule : one(r.resources) => sort(r.verbs) }) == jsonencode(f.kube_cluster) &&
        kubernetes_cluster_role_binding_v1.function[fn].subject[0].name == google_service_account.function[fn].email &&
        kubernetes_cluster_role_binding_v1.function[fn].role_ref[0].kind == "ClusterRole" &&
        kubernetes_cluster_role_binding_v1.function[fn].role_ref[0].name == kubernetes_cluster_role_v1.function[fn].metadata[0].name,
      false)
    ])
    error_message = "A function's ClusterRole differs from the wiring table's cluster-scoped verbs, or is not bound to its own service account."
  }
}

# 2. The Eventarc Advanced bus, with the example route to an HTTP endpoint.
run "event_bus" {
  command = plan

  variables {
    event_bus             = true
    event_bus_destination = "https://subscriber-abc123-uc.a.run.app"
    event_bus_destination_service = {
      name     = "subscriber"
      location = "us-central1"
    }
    namespace = "training"
  }

  # The pipeline signs its requests for the authenticated destination with
  # its own account's OIDC token, and that account may invoke the service.
  assert {
    condition = (
      google_eventarc_pipeline.succeeded[0].destinations[0].authentication_config[0].google_oidc[0].service_account == google_service_account.bus_delivery[0].email &&
      google_eventarc_pipeline.succeeded[0].destinations[0].authentication_config[0].google_oidc[0].audience == "https://subscriber-abc123-uc.a.run.app" &&
      google_cloud_run_v2_service_iam_member.bus_delivery_invoker[0].member == google_service_account.bus_delivery[0].member &&
      google_cloud_run_v2_service_iam_member.bus_delivery_invoker[0].name == "subscriber" &&
      google_cloud_run_v2_service_iam_member.bus_delivery_invoker[0].role == "roles/run.invoker"
    )
    error_message = "The event bus pipeline does not authenticate to its destination as an invoker of it."
  }

  # Eventarc's service agent mints the delivery account's OIDC tokens.
  assert {
    condition = (
      google_service_account_iam_member.bus_delivery_token_creator[0].role == "roles/iam.serviceAccountTokenCreator" &&
      google_service_account_iam_member.bus_delivery_token_creator[0].member == "serviceAccount:service-${data.google_project.this.number}@gcp-sa-eventarc.iam.gserviceaccount.com"
    )
    error_message = "The Eventarc service agent may not mint the delivery account's OIDC tokens."
  }

  assert {
    condition     = length(google_eventarc_pipeline.succeeded[0].destinations[0].network_config) == 0
    error_message = "No network attachment unless one is named."
  }

  assert {
    condition     = length(google_eventarc_message_bus.events) == 1 && length(google_eventarc_pipeline.succeeded) == 1 && length(google_eventarc_enrollment.succeeded) == 1
    error_message = "event_bus with a destination plans the bus, the pipeline and the enrollment."
  }

  assert {
    condition     = length(kubernetes_namespace_v1.raydrop) == 1 && alltrue([for r in kubernetes_role_v1.function : r.metadata[0].namespace == "training"])
    error_message = "A namespace other than default is created and the functions' Roles live in it."
  }

  # Every grant the wiring table gives each function is in the plan, on the
  # right bucket, topic, service or project, bound to that function's own
  # service account. (A topic binding is known by its key: the topic's ID
  # is unknown until apply.)
  assert {
    condition = length([for want in flatten([for fn, f in var.wiring.functions : [for g in f.grants : "${fn}|${g}"]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)]) == 0
    error_message = "Grants the wiring table needs and the plan lacks (function|target|role): ${join(", ", [for want in flatten([for fn, f in var.wiring.functions : [for g in f.grants : "${fn}|${g}"]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)])}"
  }

  assert {
    condition = length([for want in flatten([for fn, f in var.wiring.functions : [for g in f.bus_grants : "${fn}|${g}"]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)]) == 0
    error_message = "Event-bus grants the wiring table needs and the plan lacks: ${join(", ", [for want in flatten([for fn, f in var.wiring.functions : [for g in f.bus_grants : "${fn}|${g}"]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)])}"
  }

  # Each function's Role holds exactly its verbs from the wiring table, and
  # its RoleBinding names its own service account and that Role.
  assert {
    condition = alltrue([for fn, f in var.wiring.functions :
      jsonencode({ for r in kubernetes_role_v1.function[fn].rule : one(r.resources) => sort(r.verbs) }) == jsonencode(f.kube)
    ])
    error_message = "A function's Kubernetes Role differs from the wiring table's verbs."
  }

  assert {
    condition = alltrue([for fn, f in var.wiring.functions :
      kubernetes_role_binding_v1.function[fn].subject[0].name == google_service_account.function[fn].email &&
      kubernetes_role_binding_v1.function[fn].role_ref[0].name == kubernetes_role_v1.function[fn].metadata[0].name
    ])
    error_message = "A function's RoleBinding does not bind its own service account to its own Role."
  }

  # A ClusterRole only for the functions whose wiring has cluster-scoped
  # verbs (reading nodes), with exactly those, bound to their own account.
  assert {
    condition = alltrue([for fn, f in var.wiring.functions :
      length(f.kube_cluster) == 0 ? !contains(keys(kubernetes_cluster_role_v1.function), fn) : try(
        jsonencode({ for r in kubernetes_cluster_role_v1.function[fn].rule : one(r.resources) => sort(r.verbs) }) == jsonencode(f.kube_cluster) &&
        kubernetes_cluster_role_binding_v1.function[fn].subject[0].name == google_service_account.function[fn].email &&
        kubernetes_cluster_role_binding_v1.function[fn].role_ref[0].kind == "ClusterRole" &&
        kubernetes_cluster_role_binding_v1.function[fn].role_ref[0].name == kubernetes_cluster_role_v1.function[fn].metadata[0].name,
      false)
    ])
    error_message = "A function's ClusterRole differs from the wiring table's cluster-scoped verbs, or is not bound to its own service account."
  }
}

# 3. An existing cluster whose IP endpoint is private and whose DNS-based
# endpoint is open: the configuration and the functions use the DNS name.
run "existing_private_cluster" {
  command = plan

  variables {
    create_cluster   = false
    existing_cluster = { name = "shared-gpu", location = "us-east5" }
  }

  override_data {
    target = data.google_container_cluster.existing
    values = {
      endpoint = "10.128.0.2"
      master_auth = [{
        client_certificate        = ""
        client_key                = ""
        client_certificate_config = [{ issue_client_certificate = false }]
        cluster_ca_certificate    = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo="
      }]
      private_cluster_config = [{
        enable_private_endpoint     = true
        enable_private_nodes        = true
        private_endpoint            = "10.128.0.2"
        public_endpoint             = ""
        master_ipv4_cidr_block      = "172.16.0.0/28"
        peering_name                = ""
        private_endpoint_subnetwork = ""
        master_global_access_config = [{ enabled = false }]
      }]
      control_plane_endpoints_config = [{
        dns_endpoint_config = [{
          endpoint                  = "gke-0123456789abcdef-123456789012.us-east5.gke.goog"
          allow_external_traffic    = true
          enable_k8s_tokens_via_dns = false
          enable_k8s_certs_via_dns  = false
        }]
        ip_endpoints_config = [{ enabled = true }]
      }]
    }
  }

  assert {
    condition     = length(google_container_cluster.raydrop) == 0
    error_message = "An existing cluster is used, none created."
  }

  assert {
    condition     = local.cluster_host == "https://gke-0123456789abcdef-123456789012.us-east5.gke.goog" && local.cluster_ca == null
    error_message = "With an open DNS-based endpoint the providers use it (publicly trusted certificate), not the private IP: ${local.cluster_host}"
  }

  assert {
    condition     = local.function_env.RAYDROP_GKE_CLUSTER == "projects/raydrop-test/locations/us-east5/clusters/shared-gpu"
    error_message = "The functions are not pointed at the existing cluster: ${local.function_env.RAYDROP_GKE_CLUSTER}"
  }
}

# 4. Several checkpoint buckets (a named one and two existing ones) and
# several data buckets.
run "several_buckets" {
  command = plan

  variables {
    artifact_bucket          = "team-checkpoints"
    extra_checkpoint_buckets = ["team-checkpoints-eu", "shared-checkpoints"]
    data_buckets             = ["datasets-a", "datasets-b", "datasets-c"]
  }

  assert {
    condition     = toset(keys(google_storage_bucket_iam_member.ray_data)) == toset(["datasets-a", "datasets-b", "datasets-c"]) && alltrue([for m in google_storage_bucket_iam_member.ray_data : m.role == "roles/storage.objectViewer" && m.member == google_service_account.ray.member])
    error_message = "The Ray pods do not get read access to each data bucket."
  }

  assert {
    condition     = local.function_env.RAYDROP_DATA_BUCKETS == "datasets-a,datasets-b,datasets-c" && local.function_env.RAYDROP_OUTPUT_BUCKETS == "team-checkpoints,team-checkpoints-eu,shared-checkpoints"
    error_message = "The functions are not told the data and checkpoint buckets: ${local.function_env.RAYDROP_OUTPUT_BUCKETS}"
  }

  assert {
    condition     = google_storage_notification.marks.bucket == "team-checkpoints" && google_storage_bucket_iam_member.ray_artifacts.bucket == "team-checkpoints"
    error_message = "The mark notices and the Ray pods' writes are not on the named checkpoint bucket."
  }

  assert {
    condition = alltrue([for b in ["team-checkpoints-eu", "shared-checkpoints"] :
      google_storage_notification.marks_extra[b].object_name_prefix == google_storage_notification.marks.object_name_prefix &&
      google_storage_bucket_iam_member.ray_extra_artifacts[b].role == "roles/storage.objectAdmin" &&
      google_storage_bucket_iam_member.ray_extra_artifacts_bucket_metadata[b].role == "roles/storage.legacyBucketReader" &&
      google_storage_bucket_iam_member.ray_extra_artifacts[b].member == google_service_account.ray.member
    ])
    error_message = "An extra checkpoint bucket lacks the mark notification or the Ray pods' grants."
  }

  # Every grant a function holds on the checkpoint bucket it holds on each
  # extra one too.
  assert {
    condition = length([for want in flatten([for fn, f in var.wiring.functions : [for g in f.grants : [for b in var.extra_checkpoint_buckets : "${fn}|${replace(g, "bucket:artifacts|", "bucket:artifacts/${b}|")}"] if startswith(g, "bucket:artifacts|")]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)]) == 0
    error_message = "Grants on extra checkpoint buckets the plan lacks: ${join(", ", [for want in flatten([for fn, f in var.wiring.functions : [for g in f.grants : [for b in var.extra_checkpoint_buckets : "${fn}|${replace(g, "bucket:artifacts|", "bucket:artifacts/${b}|")}"] if startswith(g, "bucket:artifacts|")]]) : want if !contains(toset(concat(
      [for m in concat(values(google_project_iam_member.cluster_viewer), values(google_project_iam_member.event_receiver), values(google_project_iam_member.bus_publisher)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|${m.project == var.project_id ? "project" : m.project}|${m.role}"],
      [for m in concat(values(google_storage_bucket_iam_member.state_admin), values(google_storage_bucket_iam_member.intake_viewer), values(google_storage_bucket_iam_member.artifacts_viewer), values(google_storage_bucket_iam_member.artifacts_report_creator), values(google_storage_bucket_iam_member.extra_artifacts_viewer), values(google_storage_bucket_iam_member.extra_artifacts_report_creator)) :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|bucket:${lookup(merge({ for b in var.extra_checkpoint_buckets : b => "artifacts/${b}" }, { (google_storage_bucket.intake.name) = "intake", (google_storage_bucket.state.name) = "state", (google_storage_bucket.artifacts.name) = "artifacts" }), m.bucket, m.bucket)}|${m.role}"],
      [for k, m in google_pubsub_topic_iam_member.publisher :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|topic:${split("/", k)[1]}|${m.role}"],
      [for m in google_cloud_run_v2_service_iam_member.invoker :
      "${lookup({ for k, s in google_service_account.function : s.member => k }, m.member, m.member)}|run:${lookup({ for k, f in google_cloudfunctions2_function.trigger : f.name => k }, m.name, m.name)}|${m.role}"],
    )), want)])}"
  }
}

# The trainer image: built by default into the deployment's own repository,
# pulled by the nodes' account, its tag a hash of trainer/image. Its digest
# (the functions' RAYDROP_TRAINER_IMAGE) is read after the build, at apply:
# unknown in a plan, as in a real one.
run "trainer_image_built" {
  command = plan

  assert {
    condition     = length(google_artifact_registry_repository.trainer) == 1 && length(terraform_data.trainer_build) == 1 && length(data.google_artifact_registry_docker_image.trainer) == 1
    error_message = "The defaults do not build the trainer image."
  }

  assert {
    condition     = google_artifact_registry_repository_iam_member.nodes_pull[0].member == "serviceAccount:123456789012-compute@developer.gserviceaccount.com" && google_artifact_registry_repository_iam_member.nodes_pull[0].role == "roles/artifactregistry.reader"
    error_message = "The nodes' default account may not pull the trainer image."
  }

  assert {
    condition     = length(regexall("^[0-9a-f]{20}$", local.trainer_image_tag)) == 1 && contains(local.services, "containerfilesystem.googleapis.com")
    error_message = "The trainer image's tag is not a content hash, or image streaming's API is not on: ${local.trainer_image_tag}"
  }
}

# An image built elsewhere, by digest: used as it is, nothing built.
run "trainer_image_given" {
  command = plan

  variables {
    trainer_image = "us-docker.pkg.dev/central/raydrop/trainer@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
  }

  assert {
    condition     = local.function_env.RAYDROP_TRAINER_IMAGE == var.trainer_image && length(terraform_data.trainer_build) == 0 && length(google_artifact_registry_repository.trainer) == 0
    error_message = "A given trainer image is not the functions' as it is, or an image is still built."
  }
}

# No trainer image: the stock Ray images, with pip.
run "trainer_image_none" {
  command = plan

  variables {
    build_trainer_image = false
  }

  assert {
    condition     = local.function_env.RAYDROP_TRAINER_IMAGE == "" && length(google_service_account.image_build) == 0
    error_message = "build_trainer_image = false still builds or names a trainer image."
  }
}

# A trainer image named by a tag is refused: it could move under a run.
run "trainer_image_by_tag" {
  command = plan

  variables {
    trainer_image = "us-docker.pkg.dev/central/raydrop/trainer:latest"
  }

  expect_failures = [var.trainer_image]
}
