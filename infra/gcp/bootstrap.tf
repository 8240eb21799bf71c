# What the first apply on a fresh project needs before the functions and
# their triggers can be created: the service agents the triggers rely on,
# and time for the IAM grants to take effect.

# The Pub/Sub and Eventarc service agents exist only once something asks
# for them. Pub/Sub's forwards dead letters and pushes to the triggers;
# Eventarc's creates the triggers' subscriptions. Creating them explicitly
# lets the grants below name them on the first apply. (The GA provider has
# no resource for this; google_project_service_identity is google-beta
# only, so gcloud does it, as for the dead-letter policies.) The Cloud
# Storage agent is created by its data source in main.tf.
# https://cloud.google.com/eventarc/docs/roles-permissions
resource "terraform_data" "service_agents" {
  triggers_replace = [var.project_id]

  provisioner "local-exec" {
    interpreter = ["bash", "-euo", "pipefail", "-c"]
    command     = <<-EOT
      for service in pubsub.googleapis.com eventarc.googleapis.com; do
        gcloud beta services identity create --service="$service" --project="$PROJECT" >/dev/null
      done
    EOT
    environment = {
      PROJECT = var.project_id
    }
  }

  depends_on = [google_project_service.services]
}

# IAM changes "typically propagate in 2 minutes, but could potentially take
# 7 minutes or longer" (https://cloud.google.com/iam/docs/access-change-propagation).
# Creating a Cloud Storage trigger checks that the Cloud Storage agent may
# publish, and the first events need the functions' own grants: the
# functions wait the typical time after any grant changes. A function that
# still meets a grant in flight retries (a 403 is redelivered, never
# dropped), so waiting longer is not needed for correctness.
resource "terraform_data" "iam_propagation" {
  triggers_replace = concat(
    [for m in google_project_iam_member.cluster_viewer : m.id],
    [for m in google_project_iam_member.event_receiver : m.id],
    [for m in google_storage_bucket_iam_member.state_admin : m.id],
    [for m in google_storage_bucket_iam_member.intake_viewer : m.id],
    [for m in google_storage_bucket_iam_member.artifacts_viewer : m.id],
    [for m in google_storage_bucket_iam_member.extra_artifacts_viewer : m.id],
    [for m in google_pubsub_topic_iam_member.publisher : m.id],
    [google_project_iam_member.gcs_agent_publisher.id, google_project_iam_member.build.id],
    [for m in google_artifact_registry_repository_iam_member.build_push : m.id],
    [for m in google_storage_bucket_iam_member.build_source : m.id],
    [for m in google_project_iam_member.build_logs : m.id],
    [for m in google_secret_manager_secret_iam_member.function_hf_token : m.id],
  )

  provisioner "local-exec" {
    command = "echo 'waiting 120 s for the IAM grants to propagate' && sleep 120"
  }

  depends_on = [terraform_data.service_agents]
}
