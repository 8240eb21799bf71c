// Package config is the functions' configuration, read once from RAYDROP_*
// environment variables.
package config

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/distribution/reference"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/raydrop/raydrop/pkg/wiring"
)

// Config is the functions' configuration, read once from RAYDROP_*
// environment variables.
type Config struct {
	Project      string // RAYDROP_PROJECT: Google Cloud project of the topics
	IntakeBucket string // RAYDROP_INTAKE_BUCKET: what users drop (jobs/, cancel/)
	// RAYDROP_STATE_BUCKET: the pipeline's own state (runs/ records,
	// clusters/ leases), where no trigger listens, so its writes wake no
	// function. Default: the intake bucket (deployments made before the
	// state bucket existed).
	StateBucket string
	// RAYDROP_OUTPUT_BUCKETS (comma-separated): the buckets runs may write
	// checkpoints to, the ones the functions' identities may read. A spec
	// naming another is rejected at admission.
	OutputBuckets []string
	// RAYDROP_DATA_BUCKETS (comma-separated, optional): the buckets a spec's
	// dataset.source may read from, the ones the Ray pods' identity may
	// read. A spec naming another is rejected at admission.
	DataBuckets []string
	// RAYDROP_NAMESPACES (comma-separated, default "default"): the
	// Kubernetes namespaces runs may use, the only ones where the
	// functions' identities have Kubernetes permissions (Roles, never
	// ClusterRoles). A spec naming another is rejected at admission.
	Namespaces   []string
	Topics       wiring.Topics // RAYDROP_TOPIC_<NAME>, defaults raydrop-<name>
	EventSource  string        // RAYDROP_EVENT_SOURCE: ce-source of public events
	Kubeconfig   string        // RAYDROP_KUBECONFIG: a kubeconfig file (local cloud)
	GKECluster   string        // RAYDROP_GKE_CLUSTER: projects/P/locations/L/clusters/C
	EventBus     string        // RAYDROP_EVENT_BUS: optional Eventarc Advanced message bus
	ScaleDownAge time.Duration // RAYDROP_SCALE_DOWN_GRACE: idle time before the sweep scales workers to zero
	GPUHourUSD   float64       // RAYDROP_GPU_HOUR_USD: price of one GPU-hour for cost estimates
	// RAYDROP_TRAINER_IMAGE (optional): the deployment's trainer image, by
	// digest (repository@sha256:...), built from trainer/image: the image
	// of every Ray container whose spec names none, with nothing to
	// install at run time. Unset: the stock Ray images, with the trainer's
	// requirements pip-installed by each run's runtime env.
	TrainerImage string
	// RAYDROP_MODEL_STAGING (optional, gs://bucket[/prefix], the bucket one
	// of the output buckets): where base models are staged, once per
	// revision (pkg/weights). Unset: every node of every run downloads the
	// model from the Hugging Face Hub.
	ModelStaging string
	// RAYDROP_HF_ENDPOINT (default https://huggingface.co): the Hub the
	// functions ask which commit a model revision is; HF_TOKEN, when set,
	// is sent with it (private and gated repositories).
	HubEndpoint string
	HubToken    string
	// RAYDROP_EVIDENCE_BUDGET (default 60s): the longest the capture of a
	// run's evidence (pkg/evidence) may hold its GPU workers up before
	// they are scaled down; what it has not read by then is named missing.
	EvidenceBudget time.Duration
	// RAYDROP_EVIDENCE_LOG_CAP (default 2Mi, a Kubernetes quantity): the
	// bytes kept of each container log in the evidence, the last.
	EvidenceLogCap int64
}

// The variables LoadConfig reads (and Env writes); the topics' are
// wiring.TopicEnv's.
const (
	EnvProject        = "RAYDROP_PROJECT"
	EnvIntakeBucket   = "RAYDROP_INTAKE_BUCKET"
	EnvStateBucket    = "RAYDROP_STATE_BUCKET"
	EnvOutputBuckets  = "RAYDROP_OUTPUT_BUCKETS"
	EnvDataBuckets    = "RAYDROP_DATA_BUCKETS"
	EnvNamespaces     = "RAYDROP_NAMESPACES"
	EnvEventSource    = "RAYDROP_EVENT_SOURCE"
	EnvKubeconfig     = "RAYDROP_KUBECONFIG"
	EnvGKECluster     = "RAYDROP_GKE_CLUSTER"
	EnvEventBus       = "RAYDROP_EVENT_BUS"
	EnvScaleDownGrace = "RAYDROP_SCALE_DOWN_GRACE"
	EnvGPUHourUSD     = "RAYDROP_GPU_HOUR_USD"
	EnvTrainerImage   = "RAYDROP_TRAINER_IMAGE"
	EnvModelStaging   = "RAYDROP_MODEL_STAGING"
	EnvHubEndpoint    = "RAYDROP_HF_ENDPOINT"
	EnvHubToken       = "HF_TOKEN"
	EnvEvidenceBudget = "RAYDROP_EVIDENCE_BUDGET"
	EnvEvidenceLogCap = "RAYDROP_EVIDENCE_LOG_CAP"
)

// BusName is the form of a message bus's name (RAYDROP_EVENT_BUS).
var BusName = regexp.MustCompile(`^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/locations/[a-z0-9-]+/messageBuses/[a-z][a-z0-9-]{0,61}[a-z0-9]$`)

// PublishingEndpointEnv points the Eventarc publishing client at another
// endpoint, as the local cloud's bus: plain gRPC, no credentials. Eventarc
// has no emulator, so no variable of Google's does this.
const PublishingEndpointEnv = "RAYDROP_EVENTARC_PUBLISHING_ENDPOINT"

// DefaultGPUHourUSD is the price of a GPU-hour cost estimates use when
// RAYDROP_GPU_HOUR_USD is not set.
const DefaultGPUHourUSD = "10"

// CheckTrainerImage says what is wrong with a trainer image reference, ""
// when nothing is: it must name its image by digest, so that every run
// records exactly what it ran and a rebuilt image never changes a run
// under way.
func CheckTrainerImage(ref string) string {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return "is not a container image reference: " + err.Error()
	}
	if _, ok := named.(reference.Canonical); !ok {
		return "names no digest: give the image as repository@sha256:<digest> (the HCL's trainer_image output)"
	}
	return ""
}

// MayRead reports whether runs may read their data from bucket.
func (c Config) MayRead(bucket string) bool { return slices.Contains(c.DataBuckets, bucket) }

// MayWrite reports whether runs may write checkpoints to bucket.
func (c Config) MayWrite(bucket string) bool { return slices.Contains(c.OutputBuckets, bucket) }

// MayUse reports whether runs may use namespace.
func (c Config) MayUse(namespace string) bool { return slices.Contains(c.Namespaces, namespace) }

// list splits a comma-separated list, dropping empty items.
func list(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// LoadConfig reads the configuration from getenv (os.Getenv when nil) and
// reports every missing or malformed variable at once.
func LoadConfig(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var errs []error
	get := func(name, def string) string {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			return v
		}
		return def
	}
	need := func(name string) string {
		v := get(name, "")
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is not set", name))
		}
		return v
	}
	c := Config{
		Project:      need(EnvProject),
		IntakeBucket: need(EnvIntakeBucket),
		StateBucket:  get(EnvStateBucket, get(EnvIntakeBucket, "")),
		EventSource:  get(EnvEventSource, "//raydrop.dev/raydrop"),
		Kubeconfig:   get(EnvKubeconfig, ""),
		GKECluster:   get(EnvGKECluster, ""),
		EventBus:     get(EnvEventBus, ""),
		TrainerImage: get(EnvTrainerImage, ""),
		ModelStaging: strings.TrimSuffix(get(EnvModelStaging, ""), "/"),
		HubEndpoint:  get(EnvHubEndpoint, ""),
		HubToken:     get(EnvHubToken, ""),
	}
	def := wiring.DefaultTopics()
	for _, k := range wiring.TopicKeys {
		c.Topics.Set(k, get(wiring.TopicEnv(k), def.Name(k)))
	}
	c.OutputBuckets = list(need(EnvOutputBuckets))
	c.DataBuckets = list(get(EnvDataBuckets, ""))
	c.Namespaces = list(get(EnvNamespaces, "default"))
	if len(c.OutputBuckets) == 0 && getenv(EnvOutputBuckets) != "" {
		errs = append(errs, fmt.Errorf("%s %q names no bucket", EnvOutputBuckets, getenv(EnvOutputBuckets)))
	}
	if c.EventBus != "" && !BusName.MatchString(c.EventBus) {
		errs = append(errs, fmt.Errorf("%s %q is not a message bus name (projects/P/locations/L/messageBuses/B)", EnvEventBus, c.EventBus))
	}
	if c.TrainerImage != "" {
		if msg := CheckTrainerImage(c.TrainerImage); msg != "" {
			errs = append(errs, fmt.Errorf("%s %q %s", EnvTrainerImage, c.TrainerImage, msg))
		}
	}
	if c.ModelStaging != "" {
		bucket, _, _ := strings.Cut(strings.TrimPrefix(c.ModelStaging, "gs://"), "/")
		switch {
		case !strings.HasPrefix(c.ModelStaging, "gs://") || bucket == "":
			errs = append(errs, fmt.Errorf("%s %q is not gs://bucket[/prefix]", EnvModelStaging, c.ModelStaging))
		case !slices.Contains(c.OutputBuckets, bucket):
			errs = append(errs, fmt.Errorf("%s %q: bucket %s is not one of %s (the Ray pods write the staged models there)", EnvModelStaging, c.ModelStaging, bucket, EnvOutputBuckets))
		}
	}
	if len(c.Namespaces) == 0 {
		errs = append(errs, fmt.Errorf("%s %q names no namespace", EnvNamespaces, getenv(EnvNamespaces)))
	}
	if c.Kubeconfig == "" && c.GKECluster == "" {
		errs = append(errs, errors.New("set RAYDROP_GKE_CLUSTER (projects/P/locations/L/clusters/C) or RAYDROP_KUBECONFIG"))
	}
	var err error
	if c.ScaleDownAge, err = time.ParseDuration(get(EnvScaleDownGrace, "10m")); err != nil || c.ScaleDownAge < 0 {
		errs = append(errs, fmt.Errorf("%s %q is not a duration such as 10m", EnvScaleDownGrace, getenv(EnvScaleDownGrace)))
	}
	if c.GPUHourUSD, err = strconv.ParseFloat(get(EnvGPUHourUSD, DefaultGPUHourUSD), 64); err != nil || c.GPUHourUSD < 0 {
		errs = append(errs, fmt.Errorf("%s %q is not a non-negative number", EnvGPUHourUSD, getenv(EnvGPUHourUSD)))
	}
	if c.EvidenceBudget, err = time.ParseDuration(get(EnvEvidenceBudget, "60s")); err != nil || c.EvidenceBudget <= 0 {
		errs = append(errs, fmt.Errorf("%s %q is not a positive duration such as 60s", EnvEvidenceBudget, getenv(EnvEvidenceBudget)))
	}
	if q, err := resource.ParseQuantity(get(EnvEvidenceLogCap, "2Mi")); err != nil || q.Value() < 1024 {
		errs = append(errs, fmt.Errorf("%s %q is not a size of at least 1Ki such as 2Mi", EnvEvidenceLogCap, getenv(EnvEvidenceLogCap)))
	} else {
		c.EvidenceLogCap = q.Value()
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("configuration: %w", errors.Join(errs...))
	}
	return c, nil
}

// Parse reads a configuration from env, NAME=value entries such as Env
// writes, as LoadConfig reads the process's environment.
func Parse(env []string) (Config, error) {
	vars := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	return LoadConfig(func(k string) string { return vars[k] })
}

// Env is the environment LoadConfig reads back as c: every field that is
// set, as its variable. A field left at its zero value is left out, so
// LoadConfig gives it its default; anything that starts a function writes
// its environment with this, never the names by hand.
func (c Config) Env() []string {
	var env []string
	set := func(name, v string) {
		if v != "" {
			env = append(env, name+"="+v)
		}
	}
	set(EnvProject, c.Project)
	set(EnvIntakeBucket, c.IntakeBucket)
	set(EnvStateBucket, c.StateBucket)
	set(EnvOutputBuckets, strings.Join(c.OutputBuckets, ","))
	set(EnvDataBuckets, strings.Join(c.DataBuckets, ","))
	set(EnvNamespaces, strings.Join(c.Namespaces, ","))
	for _, k := range wiring.TopicKeys {
		set(wiring.TopicEnv(k), c.Topics.Name(k))
	}
	set(EnvEventSource, c.EventSource)
	set(EnvKubeconfig, c.Kubeconfig)
	set(EnvGKECluster, c.GKECluster)
	set(EnvEventBus, c.EventBus)
	set(EnvTrainerImage, c.TrainerImage)
	set(EnvModelStaging, c.ModelStaging)
	set(EnvHubEndpoint, c.HubEndpoint)
	set(EnvHubToken, c.HubToken)
	if c.ScaleDownAge != 0 {
		set(EnvScaleDownGrace, c.ScaleDownAge.String())
	}
	if c.EvidenceBudget != 0 {
		set(EnvEvidenceBudget, c.EvidenceBudget.String())
	}
	if c.EvidenceLogCap != 0 {
		set(EnvEvidenceLogCap, strconv.FormatInt(c.EvidenceLogCap, 10))
	}
	if c.GPUHourUSD != 0 {
		set(EnvGPUHourUSD, strconv.FormatFloat(c.GPUHourUSD, 'g', -1, 64))
	}
	return env
}
