package deploycheck

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"slices"
	"testing"

	"github.com/raydrop/raydrop/pkg/wiring"
)

var update = flag.Bool("update", false, "rewrite infra/gcp/tests/wiring.auto.tfvars.json from the wiring table")

// planVars is the plan tests' variable file: tofu test loads
// tests/*.auto.tfvars.json by itself.
type planVars struct {
	Wiring planWiring `json:"wiring"`
}

// planWiring is what the plan tests (infra/gcp/tests/*.tftest.hcl) assert
// over the planned resources: per function, the grants it needs as
// "TARGET|ROLE" (TARGET: project, bucket:<intake|state|artifacts>,
// topic:<key>, run:<trigger>), those it needs only with the event bus, and
// its Kubernetes verbs per resource.
type planWiring struct {
	Functions map[string]planFunction `json:"functions"`
}

type planFunction struct {
	Grants    []string            `json:"grants"`
	BusGrants []string            `json:"bus_grants"`
	Kube      map[string][]string `json:"kube"`
	// KubeCluster: its ClusterRole's verbs per resource.
	KubeCluster map[string][]string `json:"kube_cluster"`
}

// wiringForPlan derives each function's grants from the wiring table: the
// same rules functions.tf follows and checkIAM checks textually.
func wiringForPlan() planWiring {
	w := planWiring{Functions: map[string]planFunction{}}
	for _, fn := range wiring.Functions {
		g := []string{
			"project|roles/container.clusterViewer",
			"project|roles/eventarc.eventReceiver",
			"bucket:state|roles/storage.objectAdmin",
		}
		if fn.ReadsIntake() {
			g = append(g, "bucket:intake|roles/storage.objectViewer")
		}
		if fn.ReadsArtifacts {
			g = append(g, "bucket:artifacts|roles/storage.objectViewer")
		}
		if fn.WritesReports {
			g = append(g, "bucket:artifacts|roles/storage.objectCreator")
		}
		for _, t := range fn.Publishes {
			g = append(g, "topic:"+t+"|roles/pubsub.publisher")
		}
		for _, t := range fn.Triggers {
			g = append(g, "run:"+t.Name+"|roles/run.invoker")
		}
		bus := []string{}
		if slices.Contains(fn.Publishes, wiring.TopicEvents) {
			bus = append(bus, "project|roles/eventarc.messageBusUser")
		}
		slices.Sort(g)
		w.Functions[fn.Name] = planFunction{Grants: g, BusGrants: bus, Kube: sortedVerbs(fn.Kube), KubeCluster: sortedVerbs(fn.KubeCluster)}
	}
	return w
}

// sortedVerbs is a verbs table with each resource's verbs sorted (never
// nil: an empty table is {} in the fixture).
func sortedVerbs(table map[string][]string) map[string][]string {
	out := map[string][]string{}
	for r, verbs := range table {
		v := slices.Clone(verbs)
		slices.Sort(v)
		out[r] = v
	}
	return out
}

// TestPlanWiringFixture keeps infra/gcp/tests/wiring.auto.tfvars.json, which the plan
// tests (make infra-plan) read, equal to the wiring table. Rewrite it with
// go test ./deploycheck -run TestPlanWiringFixture -update.
func TestPlanWiringFixture(t *testing.T) {
	const path = "../../gcp/tests/wiring.auto.tfvars.json"
	want, err := json.MarshalIndent(planVars{Wiring: wiringForPlan()}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if *update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the wiring table; rewrite it: go test ./deploycheck -run TestPlanWiringFixture -update", path)
	}
}
