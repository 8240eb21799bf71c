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
#
# A pipeline sends no credentials unless told to: an authenticated Cloud
# Run service (or function) refuses its requests. With
# event_bus_destination_auth (the default) the pipeline signs each request
# with a Google OIDC token of its own service account (raydrop-bus-delivery),
# whose audience is the destination URL, and that account is made an
# invoker of var.event_bus_destination_service when it is named (else grant
# roles/run.invoker on your service to the event_bus_delivery_account
# output). A network attachment (Private Service Connect interface) is
# needed only when the destination is reachable from a VPC network alone,
# such as an internal address; set event_bus_network_attachment then.
# https://cloud.google.com/eventarc/advanced/docs/event-providers-targets,
# https://cloud.google.com/eventarc/docs/reference/rest/v1/projects.locations.pipelines#Destination
resource "google_service_account" "bus_delivery" {
  count        = var.event_bus && var.event_bus_destination != "" && var.event_bus_destination_auth ? 1 : 0
  account_id   = "raydrop-bus-delivery"
  display_name = "raydrop event bus pipeline (OIDC to the destination)"
  depends_on   = [google_project_service.services]
}

resource "google_cloud_run_v2_service_iam_member" "bus_delivery_invoker" {
  count    = length(google_service_account.bus_delivery) > 0 && var.event_bus_destination_service != null ? 1 : 0
  project  = var.project_id
  location = var.event_bus_destination_service.location
  name     = var.event_bus_destination_service.name
  role     = "roles/run.invoker"
  member   = google_service_account.bus_delivery[0].member
}

# The pipeline mints those tokens as the Eventarc service agent, which needs
# roles/iam.serviceAccountTokenCreator on the delivery account ("Eventarc
# service agents must have roles/iam.serviceAccountTokenCreator role to
# allow the Pipeline to create OpenID tokens for authenticated requests",
# Pipeline.Destination.AuthenticationConfig.OidcToken.service_account in
# https://cloud.google.com/eventarc/docs/reference/rest/v1/projects.locations.pipelines#oidctoken).
# The agent exists once terraform_data.service_agents has run.
resource "google_service_account_iam_member" "bus_delivery_token_creator" {
  count              = length(google_service_account.bus_delivery)
  service_account_id = google_service_account.bus_delivery[0].name
  role               = "roles/iam.serviceAccountTokenCreator"
  member             = "serviceAccount:service-${data.google_project.this.number}@gcp-sa-eventarc.iam.gserviceaccount.com"
  depends_on         = [terraform_data.service_agents]
}

resource "google_eventarc_pipeline" "succeeded" {
  count       = var.event_bus && var.event_bus_destination != "" ? 1 : 0
  location    = var.region
  pipeline_id = "raydrop-succeeded"
  destinations {
    http_endpoint {
      uri = var.event_bus_destination
    }
    dynamic "authentication_config" {
      for_each = google_service_account.bus_delivery
      content {
        google_oidc {
          service_account = authentication_config.value.email
          audience        = var.event_bus_destination
        }
      }
    }
    dynamic "network_config" {
      for_each = var.event_bus_network_attachment != "" ? [var.event_bus_network_attachment] : []
      content {
        network_attachment = network_config.value
      }
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
  depends_on    = [google_service_account_iam_member.bus_delivery_token_creator]
}
