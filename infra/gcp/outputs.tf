output "intake_bucket" {
  description = "Drop job specs at gs://<this>/jobs/<name>.json."
  value       = google_storage_bucket.intake.name
}

output "state_bucket" {
  description = "Run records and cluster leases (the CLI reads them)."
  value       = google_storage_bucket.state.name
}

output "artifact_bucket" {
  description = "Checkpoint bucket: the job spec's output.bucket."
  value       = google_storage_bucket.artifacts.name
}

output "source_bucket" {
  description = "Bucket holding the functions' source archive."
  value       = google_storage_bucket.source.name
}

output "topics" {
  description = "Pub/Sub topics; publish requests to topics.requests, subscribe to topics.events."
  value       = { for k, t in google_pubsub_topic.topics : k => t.name }
}

output "dead_letter_topics" {
  description = "Dead-letter topic of each trigger (each has a pull subscription of the same name)."
  value       = { for k, t in google_pubsub_topic.dead_letter : k => t.name }
}

output "gke_cluster" {
  description = "The functions' RAYDROP_GKE_CLUSTER."
  value       = local.gke_cluster
}

output "job_spec_cluster" {
  description = "Values for a job spec's cluster and output sections."
  value = {
    namespace      = var.namespace
    serviceAccount = var.ray_service_account
    reservation    = var.reservation
    outputBucket   = google_storage_bucket.artifacts.name
  }
}

output "cli_env" {
  description = "Environment for the raydrop CLI (eval \"$(tofu output -raw cli_env)\")."
  value       = "export RAYDROP_PROJECT=${var.project_id}\nexport RAYDROP_INTAKE_BUCKET=${google_storage_bucket.intake.name}\nexport RAYDROP_STATE_BUCKET=${google_storage_bucket.state.name}\n"
}

output "event_bus_delivery_account" {
  description = "The service account whose OIDC token the event bus pipeline sends to event_bus_destination (grant it roles/run.invoker on that service); null without one."
  value       = try(google_service_account.bus_delivery[0].email, null)
}

output "trainer_image" {
  description = "The trainer image every Ray container a spec names none for runs, by digest (empty: the stock Ray images, with pip)."
  value       = local.trainer_image
}
