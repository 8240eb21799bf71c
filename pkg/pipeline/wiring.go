package pipeline

import "fmt"

// Function is one of the pipeline's functions and how it is wired: its
// entry point, the triggers that deliver to it, and the topics it publishes
// to. Functions is the one place this is written: the root package
// registers the entry points from it, the local cloud routes events by it,
// the flow tests deliver by it and check every publish against it, and a
// test checks the deployment's HCL (infra/gcp/functions.tf) against it.
type Function struct {
	Name       string // the function's key: its log field and its HCL key
	EntryPoint string // the Functions Framework entry point
	Triggers   []Trigger
	Publishes  []string // topic keys (Topics.Name)
	// ReadsArtifacts: the function reads the checkpoint buckets.
	ReadsArtifacts bool
}

// Trigger delivers events to a function: a Pub/Sub topic's published
// messages, or a bucket's finalized objects. A deployed function has one
// trigger, so a function with several is deployed once per trigger.
type Trigger struct {
	Name   string // the trigger's (and its deployment's) name
	Topic  string // topic key, for a Pub/Sub trigger
	Bucket string // BucketIntake or BucketArtifacts, for a Cloud Storage trigger
}

// The buckets a trigger can listen to.
const (
	BucketIntake    = "intake"    // the intake bucket: job specs and cancellations
	BucketArtifacts = "artifacts" // every checkpoint bucket: completion marks
)

// The topic keys.
const (
	TopicRequests    = "requests"
	TopicProvisioned = "provisioned"
	TopicSubmitted   = "submitted"
	TopicTicks       = "ticks"
	TopicFinished    = "finished"
	TopicEvents      = "events"
)

// Functions is the pipeline's wiring.
var Functions = []Function{
	{
		Name: "provision", EntryPoint: "Provision", ReadsArtifacts: true,
		Triggers: []Trigger{
			{Name: "provision-intake", Bucket: BucketIntake},
			{Name: "provision-requests", Topic: TopicRequests},
		},
		Publishes: []string{TopicProvisioned, TopicSubmitted, TopicEvents},
	},
	{
		Name: "submit", EntryPoint: "Submit",
		Triggers:  []Trigger{{Name: "submit", Topic: TopicProvisioned}},
		Publishes: []string{TopicSubmitted, TopicFinished},
	},
	{
		Name: "monitor", EntryPoint: "Monitor", ReadsArtifacts: true,
		Triggers: []Trigger{
			{Name: "monitor-submitted", Topic: TopicSubmitted},
			{Name: "monitor-ticks", Topic: TopicTicks},
			{Name: "monitor-marks", Bucket: BucketArtifacts},
		},
		Publishes: []string{TopicProvisioned, TopicFinished, TopicEvents},
	},
	{
		Name: "finalize", EntryPoint: "Finalize", ReadsArtifacts: true,
		Triggers:  []Trigger{{Name: "finalize", Topic: TopicFinished}},
		Publishes: []string{TopicProvisioned, TopicEvents},
	},
}

// TopicKeys are every topic the pipeline uses.
var TopicKeys = []string{TopicRequests, TopicProvisioned, TopicSubmitted, TopicTicks, TopicFinished, TopicEvents}

// Name is the topic of a key.
func (t Topics) Name(key string) string { return *t.field(key) }

func (t *Topics) field(key string) *string {
	switch key {
	case TopicRequests:
		return &t.Requests
	case TopicProvisioned:
		return &t.Provisioned
	case TopicSubmitted:
		return &t.Submitted
	case TopicTicks:
		return &t.Ticks
	case TopicFinished:
		return &t.Finished
	case TopicEvents:
		return &t.Events
	}
	panic(fmt.Sprintf("no topic key %q", key))
}

// FunctionOf is the function a trigger delivers to.
func FunctionOf(trigger string) (Function, bool) {
	for _, f := range Functions {
		for _, t := range f.Triggers {
			if t.Name == trigger {
				return f, true
			}
		}
	}
	return Function{}, false
}
