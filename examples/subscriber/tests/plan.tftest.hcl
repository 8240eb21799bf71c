# The example subscriber planned offline with the real google provider
# (unknown-until-apply values stay unknown) and a mocked archive provider.
# Run by make infra-plan.

provider "google" {
  project      = "raydrop-test"
  region       = "us-central1"
  access_token = "offline"
}

mock_provider "archive" {
  mock_data "archive_file" {
    defaults = {
      output_sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    }
  }
}

variables {
  project_id         = "raydrop-test"
  checkpoint_bucket  = "raydrop-test-raydrop-checkpoints"
  destination_bucket = "models"
  source_bucket      = "raydrop-test-raydrop-source"
}

run "defaults" {
  command = plan

  assert {
    condition     = google_cloudfunctions2_function.subscriber.event_trigger[0].pubsub_topic == "projects/raydrop-test/topics/raydrop-events"
    error_message = "The trigger does not listen to raydrop's events topic."
  }

  assert {
    condition = (
      google_storage_bucket_iam_member.checkpoint_viewer.member == google_service_account.function.member &&
      google_storage_bucket_iam_member.checkpoint_viewer.role == "roles/storage.objectViewer" &&
      google_storage_bucket_iam_member.destination_admin.bucket == "models" &&
      google_project_iam_member.event_receiver.member == google_service_account.function.member &&
      google_cloud_run_v2_service_iam_member.invoker.member == google_service_account.function.member
    )
    error_message = "The subscriber's identity lacks a grant it needs."
  }
}

run "topic_by_id" {
  command = plan

  variables {
    topic = "projects/other-project/topics/raydrop-events"
  }

  assert {
    condition     = google_cloudfunctions2_function.subscriber.event_trigger[0].pubsub_topic == "projects/other-project/topics/raydrop-events"
    error_message = "A topic given by its full ID is used as is."
  }
}
