package pipeline

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

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
	Topics       Topics        // RAYDROP_TOPIC_<NAME>, defaults raydrop-<name>
	EventSource  string        // RAYDROP_EVENT_SOURCE: ce-source of public events
	Kubeconfig   string        // RAYDROP_KUBECONFIG: a kubeconfig file (local cloud)
	GKECluster   string        // RAYDROP_GKE_CLUSTER: projects/P/locations/L/clusters/C
	EventBus     string        // RAYDROP_EVENT_BUS: optional Eventarc Advanced message bus
	ScaleDownAge time.Duration // RAYDROP_SCALE_DOWN_GRACE: idle time before the sweep scales workers to zero
	GPUHourUSD   float64       // RAYDROP_GPU_HOUR_USD: price of one GPU-hour for cost estimates
}

// DefaultGPUHourUSD is the price of a GPU-hour cost estimates use when
// RAYDROP_GPU_HOUR_USD is not set.
const DefaultGPUHourUSD = "10"

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
		Project:      need("RAYDROP_PROJECT"),
		IntakeBucket: need("RAYDROP_INTAKE_BUCKET"),
		StateBucket:  get("RAYDROP_STATE_BUCKET", get("RAYDROP_INTAKE_BUCKET", "")),
		EventSource:  get("RAYDROP_EVENT_SOURCE", "//raydrop.dev/raydrop"),
		Kubeconfig:   get("RAYDROP_KUBECONFIG", ""),
		GKECluster:   get("RAYDROP_GKE_CLUSTER", ""),
		EventBus:     get("RAYDROP_EVENT_BUS", ""),
	}
	def := DefaultTopics()
	for _, k := range TopicKeys {
		*c.Topics.field(k) = get(TopicEnv(k), def.Name(k))
	}
	c.OutputBuckets = list(need("RAYDROP_OUTPUT_BUCKETS"))
	c.DataBuckets = list(get("RAYDROP_DATA_BUCKETS", ""))
	c.Namespaces = list(get("RAYDROP_NAMESPACES", "default"))
	if len(c.OutputBuckets) == 0 && getenv("RAYDROP_OUTPUT_BUCKETS") != "" {
		errs = append(errs, fmt.Errorf("RAYDROP_OUTPUT_BUCKETS %q names no bucket", getenv("RAYDROP_OUTPUT_BUCKETS")))
	}
	if c.EventBus != "" && !BusName.MatchString(c.EventBus) {
		errs = append(errs, fmt.Errorf("RAYDROP_EVENT_BUS %q is not a message bus name (projects/P/locations/L/messageBuses/B)", c.EventBus))
	}
	if len(c.Namespaces) == 0 {
		errs = append(errs, fmt.Errorf("RAYDROP_NAMESPACES %q names no namespace", getenv("RAYDROP_NAMESPACES")))
	}
	if c.Kubeconfig == "" && c.GKECluster == "" {
		errs = append(errs, errors.New("set RAYDROP_GKE_CLUSTER (projects/P/locations/L/clusters/C) or RAYDROP_KUBECONFIG"))
	}
	var err error
	if c.ScaleDownAge, err = time.ParseDuration(get("RAYDROP_SCALE_DOWN_GRACE", "10m")); err != nil || c.ScaleDownAge < 0 {
		errs = append(errs, fmt.Errorf("RAYDROP_SCALE_DOWN_GRACE %q is not a duration such as 10m", getenv("RAYDROP_SCALE_DOWN_GRACE")))
	}
	if c.GPUHourUSD, err = strconv.ParseFloat(get("RAYDROP_GPU_HOUR_USD", DefaultGPUHourUSD), 64); err != nil || c.GPUHourUSD < 0 {
		errs = append(errs, fmt.Errorf("RAYDROP_GPU_HOUR_USD %q is not a non-negative number", getenv("RAYDROP_GPU_HOUR_USD")))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("configuration: %w", errors.Join(errs...))
	}
	return c, nil
}
