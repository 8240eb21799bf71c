// Package flow holds the tests that drive the four functions together over
// in-memory fakes of Cloud Storage, Pub/Sub and the Kubernetes API: every
// step, duplicate deliveries, queueing, cancellation, retries, deadlines
// and lost messages. The end-to-end suite on the local cloud repeats the
// important ones against real emulators and the real KubeRay reconcilers.
package flow
