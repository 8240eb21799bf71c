# Eventarc Advanced (optional, var.event_bus): a message bus that receives
# every public event as well as the raydrop-events topic, so that
# enrollments can route them by type and subject with CEL. The functions
# publish to it with Eventarc's publishing API (RAYDROP_EVENT_BUS); an event
# the bus does not take waits in the state bucket for the next sweep.
# https://cloud.google.com/eventarc/advanced/docs/overview

resource "google_eventarc_message_bus" "events" {
  count          = var.event_bus ? 1 : 0
  location       = var.region
  message_bus_id = "raydrop-events"
  depends_on     = [google_project_service.services]
}

# Publishing to a bus needs eventarc.messageBuses.publish
# (roles/eventarc.messageBusUser), for each function that publishes events.
# https://cloud.google.com/eventarc/advanced/docs/access-control
resource "google_project_iam_member" "bus_publisher" {
  for_each = var.event_bus ? toset([for fn, f in local.functions : fn if contains(f.publishes, "events")]) : toset([])
  project  = var.project_id
  role     = "roles/eventarc.messageBusUser"
  member   = google_service_account.function[each.key].member
}

# An example route: every succeeded run's event to an HTTP endpoint
# (var.event_bus_destination), through a pipeline. Enrollments match with
# CEL on the CloudEvent's attributes: message.type, message.subject, ….
resource "google_eventarc_pipeline" "succeeded" {
  count       = var.event_bus && var.event_bus_destination != "" ? 1 : 0
  location    = var.region
  pipeline_id = "raydrop-succeeded"
  destinations {
    http_endpoint {
      uri = var.event_bus_destination
    }
  }
}

resource "google_eventarc_enrollment" "succeeded" {
  count         = var.event_bus && var.event_bus_destination != "" ? 1 : 0
  location      = var.region
  enrollment_id = "raydrop-succeeded"
  message_bus   = google_eventarc_message_bus.events[0].id
  destination   = google_eventarc_pipeline.succeeded[0].id
  cel_match     = "message.type == 'dev.raydrop.run.v1.succeeded'"
}
