package config

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/wiring"
)

// full is a configuration with every field set to something other than
// its default.
func full() Config {
	c := Config{
		Project: "p-1", IntakeBucket: "in", StateBucket: "state", OutputBuckets: []string{"out-a", "out-b"},
		DataBuckets: []string{"data"}, Namespaces: []string{"ns-a", "ns-b"}, EventSource: "//example.com/raydrop",
		Kubeconfig: "/k/config", GKECluster: "projects/p-1/locations/l/clusters/c",
		EventBus:     "projects/p-12345/locations/us-central1/messageBuses/bus",
		ScaleDownAge: 90 * time.Second, GPUHourUSD: 2.5, EvidenceBudget: 45 * time.Second, EvidenceLogCap: 1 << 20,
		TrainerImage: "us-docker.pkg.dev/p-1/raydrop/trainer@sha256:" + strings.Repeat("ab", 32),
		ModelStaging: "gs://out-a/models", HubEndpoint: "http://127.0.0.1:9/hub", HubToken: "hf_x",
	}
	for _, k := range wiring.TopicKeys {
		c.Topics.Set(k, "t-"+k)
	}
	return c
}

// TestEnvIsLoadConfigsInverse: LoadConfig reads back what Env writes, for
// every field. A field added to Config without its variable in Env (or in
// LoadConfig) fails here: full() must set it, and the round trip loses it.
func TestEnvIsLoadConfigsInverse(t *testing.T) {
	c := full()
	v := reflect.ValueOf(c)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("full() leaves %s at its zero value: set it, and write its variable in Env", v.Type().Field(i).Name)
		}
	}
	seen := map[string]bool{}
	for _, kv := range c.Env() {
		k, _, _ := strings.Cut(kv, "=")
		if seen[k] {
			t.Fatalf("Env writes %s twice", k)
		}
		seen[k] = true
	}
	got, err := Parse(c.Env())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, c) {
		t.Fatalf("LoadConfig(Env()) = %+v\nwant %+v", got, c)
	}
}

// TestEnvLeavesDefaultsOut: a partial configuration's environment names
// only what is set, so LoadConfig fills in the defaults.
func TestEnvLeavesDefaultsOut(t *testing.T) {
	env := Config{Project: "p", IntakeBucket: "in", OutputBuckets: []string{"out"}, Kubeconfig: "/k"}.Env()
	want := []string{EnvProject + "=p", EnvIntakeBucket + "=in", EnvOutputBuckets + "=out", EnvKubeconfig + "=/k"}
	if !reflect.DeepEqual(env, want) {
		t.Fatalf("Env() = %q, want %q", env, want)
	}
	c, err := Parse(env)
	if err != nil {
		t.Fatal(err)
	}
	if c.StateBucket != "in" || c.ScaleDownAge != 10*time.Minute || c.GPUHourUSD != 10 || c.EvidenceBudget != time.Minute || c.EvidenceLogCap != 2<<20 || c.Topics != wiring.DefaultTopics() ||
		!reflect.DeepEqual(c.Namespaces, []string{"default"}) {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

// TestLoadConfigNamesEveryProblem: every missing or malformed variable is
// reported at once, by name.
func TestLoadConfigNamesEveryProblem(t *testing.T) {
	vars := map[string]string{EnvOutputBuckets: " , ", EnvEventBus: "bus", EnvNamespaces: ",", EnvScaleDownGrace: "soon", EnvGPUHourUSD: "-1",
		EnvTrainerImage: "us-docker.pkg.dev/p-1/raydrop/trainer:latest", EnvEvidenceBudget: "0s", EnvEvidenceLogCap: "2 megs"}
	_, err := LoadConfig(func(k string) string { return vars[k] })
	if err == nil {
		t.Fatal("no error")
	}
	for _, name := range []string{EnvProject, EnvIntakeBucket, EnvOutputBuckets, EnvEventBus, EnvNamespaces, EnvScaleDownGrace, EnvGPUHourUSD, EnvGKECluster, EnvTrainerImage, EnvEvidenceBudget, EnvEvidenceLogCap} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s: %v", name, err)
		}
	}
}

// TestTrainerImageByDigestOnly: the trainer image must name its digest (a
// tag can move under a run); anything else is refused with what to give.
func TestTrainerImageByDigestOnly(t *testing.T) {
	digest := "@sha256:" + strings.Repeat("0f", 32)
	for ref, want := range map[string]string{
		"us-docker.pkg.dev/p/raydrop/trainer" + digest:    "",
		"us-docker.pkg.dev/p/raydrop/trainer:v1" + digest: "",
		"us-docker.pkg.dev/p/raydrop/trainer:v1":          "names no digest",
		"us-docker.pkg.dev/p/raydrop/trainer":             "names no digest",
		"Not An Image" + digest:                           "is not a container image reference",
		"us-docker.pkg.dev/p/raydrop/trainer@sha256:abc":  "is not a container image reference",
	} {
		got := CheckTrainerImage(ref)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("CheckTrainerImage(%q) = %q, want %q", ref, got, want)
		}
	}
}

// TestModelStagingInAnOutputBucket: the staged models live in a bucket the
// Ray pods write (an output bucket); any other place is refused, named.
func TestModelStagingInAnOutputBucket(t *testing.T) {
	for staging, want := range map[string]string{
		"gs://out-a/models": "",
		"gs://out-a/":       "",
		"gs://elsewhere/m":  "bucket elsewhere is not one of " + EnvOutputBuckets,
		"s3://out-a/models": "is not gs://bucket[/prefix]",
		"gs:///models":      "is not gs://bucket[/prefix]",
	} {
		c := full()
		c.ModelStaging = staging
		got, err := Parse(c.Env())
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v", staging, err)
		case want == "" && got.ModelStaging != strings.TrimSuffix(staging, "/"):
			t.Errorf("%s read back as %q", staging, got.ModelStaging)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: error %v, want one saying %q", staging, err, want)
		}
	}
}
