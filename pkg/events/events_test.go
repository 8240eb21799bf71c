package events_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

var update = flag.Bool("update", false, "rewrite golden files")

func schemaPath(phase string) string { return "../../schemas/events/" + events.Type(phase) + ".json" }

// TestEveryReasonDocumented: every reason is in the schema with what it
// means.
func TestEveryReasonDocumented(t *testing.T) {
	s := string(events.Schema("failed"))
	for r, doc := range runs.Reasons() {
		if doc == "" || !strings.Contains(s, `"const": "`+string(r)+`"`) {
			t.Errorf("reason %s is not documented in the event schema", r)
		}
	}
}

const envelopePath = "../../schemas/events/cloudevent.json"

// TestSchemasUpToDate keeps schemas/events/ equal to the generated schemas.
func TestSchemasUpToDate(t *testing.T) {
	files := map[string][]byte{envelopePath: events.EnvelopeSchema()}
	for _, p := range events.Phases {
		files[schemaPath(p)] = events.Schema(p)
	}
	for _, p := range events.SweepPhases {
		files["../../schemas/events/"+events.SweepType(p)+".json"] = events.SweepSchema(p)
	}
	for path, got := range files {
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is missing or stale (go test ./pkg/events -update): %v", path, err)
		}
	}
}

// TestEnvelopeSchema: a structured-mode event validates against the
// envelope schema, which checks its data by type; a wrong type, a missing
// attribute and data of another phase's shape do not.
func TestEnvelopeSchema(t *testing.T) {
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	docs := map[string][]byte{events.EnvelopeID: events.EnvelopeSchema()}
	for _, p := range events.Phases {
		docs[events.SchemaID(p)] = events.Schema(p)
	}
	for _, p := range events.SweepPhases {
		docs[events.SweepSchemaID(p)] = events.SweepSchema(p)
	}
	for id, doc := range docs {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.AddResource(id, v); err != nil {
			t.Fatal(err)
		}
	}
	sch, err := c.Compile(events.EnvelopeID)
	if err != nil {
		t.Fatal(err)
	}
	e, err := events.New("//raydrop.dev/test", withAttempt(events.Run{RunID: "job-0123456789ab", Name: "job", Source: "gs://i/jobs/job.json#1", Phase: "running"}), time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, doc []byte, valid bool) {
		t.Helper()
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		if err := sch.Validate(v); (err == nil) != valid {
			t.Errorf("%s: valid %v, want %v: %v\n%s", name, err == nil, valid, err, doc)
		}
	}
	check("the event", b, true)
	check("another type", bytes.Replace(b, []byte(events.Type("running")), []byte("dev.raydrop.run.v1.done"), 1), false)
	check("no subject", bytes.Replace(b, []byte(`"subject"`), []byte(`"subjekt"`), 1), false)
	// A running event's data under the failed type lacks the reason.
	check("data of another phase", bytes.Replace(b, []byte(events.Type("running")), []byte(events.Type("failed")), 1), false)
}

// Compile compiles the schema of a phase's event data with an independent
// validator.
func compile(t testing.TB, phase string) *jsonschema.Schema {
	t.Helper()
	return compileDoc(t, events.SchemaID(phase), events.Schema(phase))
}

// compileDoc compiles the schema document schema, whose $id is id.
func compileDoc(t testing.TB, id string, schema []byte) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(id, doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(id)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEventsValidate(t *testing.T) {
	end := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	ck := checkpoints.Checkpoint{Name: "checkpoint_000000", URI: "gs://b/r/attempt-1/T/checkpoint_000000/checkpoint", Step: 10, Epoch: 1, Metrics: map[string]float64{"loss": 1.2}, Complete: true}
	base := events.Run{RunID: "job-0123456789ab", Name: "job", Source: "gs://intake/jobs/job.json#1"}
	good := map[string]events.Run{
		"accepted": base,
		"queued": func() events.Run {
			r := base
			r.Reason, r.Message = runs.WaitingForCluster, "waiting for cluster c held by run other"
			return r
		}(),
		"running": withAttempt(base),
		"succeeded": func() events.Run {
			r := withAttempt(base)
			r.Checkpoints = []checkpoints.Checkpoint{ck}
			r.LatestCheckpoint, r.BestCheckpoint = &ck, &ck
			r.FinalMetrics = map[string]float64{"train_loss": 1.1}
			r.Timings = map[string]float64{"RUNNING": 500}
			h, c := 2.2, 30.5
			r.GPUHours, r.EstimatedCostUSD, r.EndedAt = &h, &c, &end
			return r
		}(),
		"failed": func() events.Run {
			r := withAttempt(base)
			r.Reason, r.Message, r.Checkpoints, r.Timings, r.EndedAt = runs.ApplicationError, "training failed: ValueError", []checkpoints.Checkpoint{}, map[string]float64{}, &end
			return r
		}(),
		"rejected": func() events.Run {
			r := base
			r.Reason, r.Message, r.Problems, r.Timings, r.EndedAt = runs.InvalidSpec, "invalid job spec", []spec.Problem{{Path: "lora.r", Message: "0 is out of range"}}, map[string]float64{}, &end
			return r
		}(),
	}
	for phase, data := range good {
		data.Phase = phase
		e, err := events.New("//raydrop.dev/test", data, end)
		if err != nil {
			t.Fatal(err)
		}
		validateEvent(t, e.Data(), phase)
		// The Pub/Sub binding round-trips.
		back, err := events.FromPubSub(events.PubSubAttributes(e), e.Data())
		if err != nil {
			t.Fatalf("%s: %v", phase, err)
		}
		if back.ID() != data.RunID+"/"+phase || back.Type() != events.Type(phase) || back.Subject() != "runs/"+data.RunID || !bytes.Equal(back.Data(), e.Data()) {
			t.Errorf("%s: round trip changed the event: %v", phase, back)
		}
	}
	// A failed event must carry a reason the schema lists.
	for _, reason := range []runs.Reason{"", "SomethingElse"} {
		f := good["failed"]
		f.Phase, f.Reason = "failed", reason
		e, _ := events.New("//raydrop.dev/test", f, end)
		if err := compile(t, "failed").Validate(decode(t, e.Data())); err == nil {
			t.Errorf("schema accepts a failed event with reason %q", reason)
		}
	}
	// A succeeded event without checkpoints is refused.
	bad := good["succeeded"]
	bad.Phase, bad.Checkpoints = "succeeded", nil
	e, _ := events.New("//raydrop.dev/test", bad, end)
	if err := compile(t, "succeeded").Validate(decode(t, e.Data())); err == nil {
		t.Error("schema accepts a succeeded event without checkpoints")
	}
}

func withAttempt(r events.Run) events.Run { r.Attempt = 1; return r }

func validateEvent(t *testing.T, data []byte, phase string) {
	t.Helper()
	if err := compile(t, phase).Validate(decode(t, data)); err != nil {
		t.Errorf("%s event does not validate: %v\n%s", phase, err, data)
	}
}

func decode(t *testing.T, b []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var sanity map[string]any
	_ = json.Unmarshal(b, &sanity)
	return v
}
