// Package wiring is the pipeline's wiring, written once: its functions,
// the triggers that deliver to them, the topics they publish to, and what
// each function's identity may do (Cloud Storage, Kubernetes RBAC). The
// root package registers the entry points from it, the local cloud routes
// events and grants permissions by it, and the deployment's HCL is checked
// against it.
package wiring

import (
	"fmt"
	"slices"
	"strings"
)

// Function is one of the pipeline's functions, how it is wired and what
// its identity may do: its entry point, the triggers that deliver to it,
// the topics it publishes to, the buckets it reads and the Kubernetes verbs
// it uses. Functions is the one place this is written: the root package
// registers the entry points from it, the local cloud routes events by it
// and grants each function's identity exactly this (Kubernetes RBAC, Cloud
// Storage), the flow tests deliver by it and check every publish against
// it, and a test checks the deployment's HCL (infra/gcp/functions.tf) and
// its IAM and RBAC against it.
type Function struct {
	Name       string // the function's key: its log field and its HCL key
	EntryPoint string // the Functions Framework entry point
	Triggers   []Trigger
	Publishes  []string // topic keys (Topics.Name)
	// ReadsArtifacts: the function reads the checkpoint buckets. Every
	// function reads and writes the state bucket (records, leases); only
	// the function triggered by the intake bucket reads it (ReadsIntake).
	ReadsArtifacts bool
	// WritesReports: the function creates objects of the runs' own in the
	// checkpoint buckets, their reports and evidence
	// (roles/storage.objectCreator: new objects only, never replacing one).
	WritesReports bool
	// Kube is the verbs the function uses on each kind of object, granted
	// in the namespaces runs may use (Config.Namespaces) and nowhere else.
	// No function touches Secrets, or anything cluster-wide but reading
	// nodes (KubeCluster); the monitor
	// lists pods (to see workers wait for capacity or lose their nodes)
	// and the Events KubeRay records on the RayClusters (a worker pod it
	// deleted after its node went away), and changes none; finalize
	// reads pods, their logs and events for the evidence, and changes none.
	Kube map[string][]string
	// KubeCluster is the verbs the function uses on cluster-scoped
	// objects, granted by a ClusterRole: read-only, and only the nodes
	// the evidence records (their labels and conditions).
	KubeCluster map[string][]string
}

// The Kubernetes resources the functions use, with their API groups.
const (
	ResourceConfigMaps  = "configmaps"
	ResourceEvents      = "events"
	ResourcePods        = "pods"
	ResourcePodLogs     = "pods/log"
	ResourceNodes       = "nodes"
	ResourceRayClusters = "rayclusters"
	ResourceRayJobs     = "rayjobs"
)

// KubeGroups are the API groups of the resources in Function.Kube.
var KubeGroups = map[string]string{ResourceConfigMaps: "", ResourceEvents: "", ResourcePods: "", ResourcePodLogs: "", ResourceNodes: "", ResourceRayClusters: "ray.io", ResourceRayJobs: "ray.io"}

// Trigger delivers events to a function: a Pub/Sub topic's published
// messages, or a bucket's finalized objects. A deployed function has one
// trigger, so a function with several is deployed once per trigger.
type Trigger struct {
	Name   string // the trigger's (and its deployment's) name
	Topic  string // topic key, for a Pub/Sub trigger
	Bucket string // BucketIntake, for a Cloud Storage trigger
}

// The bucket a trigger can listen to: the intake bucket, where users drop
// job specs and cancellations. (The checkpoint buckets reach Monitor through
// a filtered notification on TopicMarks, not a bucket trigger.)
const BucketIntake = "intake"

// The topic keys.
const (
	TopicRequests    = "requests"
	TopicProvisioned = "provisioned"
	TopicSubmitted   = "submitted"
	TopicTicks       = "ticks"
	TopicFinished    = "finished"
	TopicEvents      = "events"
	// TopicMarks carries the checkpoint buckets' notifications of mark
	// notices (names.NoticePrefix): Cloud Storage publishes to it, no
	// function does.
	TopicMarks = "marks"
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
		// Starts attempts (StartAttempt): the trainer's ConfigMap, then the
		// RayCluster created or scaled back up.
		Kube: map[string][]string{ResourceConfigMaps: {"create"}, ResourceRayClusters: {"create", "get", "update"}},
	},
	{
		Name: "submit", EntryPoint: "Submit", ReadsArtifacts: true, // the staged models' markers
		Triggers:  []Trigger{{Name: "submit", Topic: TopicProvisioned}},
		Publishes: []string{TopicSubmitted, TopicFinished},
		Kube:      map[string][]string{ResourceRayJobs: {"create"}},
	},
	{
		Name: "monitor", EntryPoint: "Monitor", ReadsArtifacts: true, WritesReports: true, // the evidence
		Triggers: []Trigger{
			{Name: "monitor-submitted", Topic: TopicSubmitted},
			{Name: "monitor-ticks", Topic: TopicTicks},
			{Name: "monitor-marks", Topic: TopicMarks},
		},
		Publishes: []string{TopicProvisioned, TopicFinished, TopicEvents},
		// Watches its jobs, cancels (deletes) them, starts retries, and
		// the sweep lists jobs and clusters and scales idle ones to zero;
		// before it deletes a job or retries, it keeps the evidence. It
		// deletes the head pod a failed run kept for a look, once its
		// time is up.
		Kube: map[string][]string{
			ResourceConfigMaps:  {"create"},
			ResourceEvents:      {"list"},
			ResourcePods:        {"delete", "list"},
			ResourcePodLogs:     {"get"},
			ResourceRayClusters: {"create", "get", "list", "update"},
			ResourceRayJobs:     {"delete", "get", "list"},
		},
		KubeCluster: map[string][]string{ResourceNodes: {"get"}},
	},
	{
		Name: "finalize", EntryPoint: "Finalize", ReadsArtifacts: true, WritesReports: true,
		Triggers:  []Trigger{{Name: "finalize", Topic: TopicFinished}},
		Publishes: []string{TopicProvisioned, TopicEvents},
		// Deletes a cancelled run's job, scales the cluster to zero or
		// hands it to the next run in its queue; before that it keeps the
		// evidence (pkg/evidence): the pods' logs, statuses and events.
		Kube: map[string][]string{
			ResourceConfigMaps:  {"create"},
			ResourceEvents:      {"list"},
			ResourcePods:        {"list"},
			ResourcePodLogs:     {"get"},
			ResourceRayClusters: {"create", "get", "update"},
			ResourceRayJobs:     {"delete"},
		},
		KubeCluster: map[string][]string{ResourceNodes: {"get"}},
	},
}

// TopicKeys are every topic the pipeline uses.
var TopicKeys = []string{TopicRequests, TopicProvisioned, TopicSubmitted, TopicTicks, TopicFinished, TopicEvents, TopicMarks}

// Name is the topic of a key.
func (t Topics) Name(key string) string { return *t.field(key) }

// Set names the topic of a key.
func (t *Topics) Set(key, name string) { *t.field(key) = name }

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
	case TopicMarks:
		return &t.Marks
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

// Identity is the email of the function's service account in project:
// raydrop-<name>, as the deployment creates it. GKE authenticates it to
// the Kubernetes API under this name, the user its RoleBindings name
// (https://cloud.google.com/kubernetes-engine/docs/how-to/role-based-access-control#rolebinding).
func (f Function) Identity(project string) string {
	return "raydrop-" + f.Name + "@" + project + ".iam.gserviceaccount.com"
}

// ReadsIntake reports whether the function reads the intake bucket: it is
// the one its objects trigger.
func (f Function) ReadsIntake() bool {
	return slices.ContainsFunc(f.Triggers, func(t Trigger) bool { return t.Bucket == BucketIntake })
}

// Topics names every Pub/Sub topic the pipeline uses.
type Topics struct {
	Requests    string
	Provisioned string
	Submitted   string
	Ticks       string
	Finished    string
	Events      string
	Marks       string
}

// DefaultTopics are the topics when no RAYDROP_TOPIC_* variable names
// them: raydrop-<key>.
func DefaultTopics() Topics {
	var t Topics
	for _, k := range TopicKeys {
		*t.field(k) = "raydrop-" + k
	}
	return t
}

// TopicEnv is the variable that names the topic of a key.
func TopicEnv(key string) string { return "RAYDROP_TOPIC_" + strings.ToUpper(key) }
