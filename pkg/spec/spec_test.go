package spec_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/raydrop/raydrop/pkg/spec"
)

var update = flag.Bool("update", false, "rewrite golden files")

const schemaFile = "../../schemas/jobspec.v1.json"

func TestExampleReproducesReference(t *testing.T) {
	data, err := os.ReadFile("../../examples/gemma3-vision.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := spec.Parse(data)
	if err != nil {
		t.Fatalf("example is invalid: %v", err)
	}
	want := spec.Defaults()
	want.Schema = "../schemas/jobspec.v1.json"
	want.Name = "gemma3-vision"
	want.Cluster.ServiceAccount = "ray-sa"
	want.Cluster.Reservation = "b200-reservation"
	want.Output.Bucket = "my-project-raydrop-checkpoints"
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("example spec differs from the defaults plus its three project values:\n got %+v\nwant %+v", *got, want)
	}
}

// TestDefaultsAreReference pins the defaults to the reference workload's
// values, so a change to one is a deliberate act.
func TestDefaultsAreReference(t *testing.T) {
	d := spec.Defaults()
	checks := []struct {
		name      string
		got, want any
	}{
		{"model", d.Model.ID, "google/gemma-3-4b-it"},
		{"dataset", d.Dataset.ID, "philschmid/amazon-product-descriptions-vlm"},
		{"lora r", d.LoRA.R, 16},
		{"lora alpha", d.LoRA.Alpha, 16},
		{"lora dropout", d.LoRA.Dropout, 0.05},
		{"epochs", d.Training.Epochs, 3},
		// The tutorial's global batch (16 workers x 1 x 4), in one micro-batch.
		{"global batch", d.Training.Workers * d.Training.PerDeviceBatchSize * d.Training.GradientAccumulationSteps, 64},
		{"learning rate", d.Training.LearningRate, 2e-4},
		{"max grad norm", d.Training.MaxGradNorm, 0.3},
		{"warmup", d.Training.WarmupRatio, 0.03},
		{"workers", d.Training.Workers, 16},
		{"accelerator type", d.Training.AcceleratorType, "B200"},
		{"replicas", d.Cluster.Workers.Replicas, 2},
		{"gpus", d.Cluster.Workers.GPUs, 8},
		// Empty: the deployment's trainer image, else the stock Ray images.
		{"head image", d.Cluster.Head.Image, ""},
		{"worker image", d.Cluster.Workers.Image, ""},
		{"stock head image", d.Cluster.HeadImage(), "rayproject/ray:2.48.0"},
		{"stock worker image", d.Cluster.WorkerImage(), "rayproject/ray:2.48.0-gpu"},
		{"head cpu", d.Cluster.Head.CPU, "24"},
		{"head memory", d.Cluster.Head.Memory, "64Gi"},
		{"head storage", d.Cluster.Head.EphemeralStorage, "9Gi"},
		{"worker cpu", d.Cluster.Workers.CPU, "80"},
		{"worker memory", d.Cluster.Workers.Memory, "320Gi"},
		{"accelerator", d.Cluster.Workers.Accelerator, "nvidia-b200"},
		{"secret", d.Cluster.HFSecret, spec.SecretRef{Name: "hf-secret", Key: "hf_api_token"}},
		{"deadline", time.Duration(d.Limits.Deadline), 24 * time.Hour},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("default %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// The three per-project values have no default: a spec must choose them.
	if d.Cluster.ServiceAccount != "" || d.Cluster.Reservation != "" || d.Output.Bucket != "" {
		t.Error("service account, reservation and bucket must have no default")
	}
}

func TestGoodSpecs(t *testing.T) {
	files, _ := filepath.Glob("testdata/good/*.json")
	if len(files) == 0 {
		t.Fatal("no good specs")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := spec.Parse(data); err != nil {
				t.Errorf("valid spec rejected: %v", err)
			}
		})
	}
}

// TestBadSpecs checks every problem reported for each bad spec against a
// golden list of "path: message" lines (go test -update rewrites them).
func TestBadSpecs(t *testing.T) {
	files, _ := filepath.Glob("testdata/bad/*.json")
	if len(files) < 30 {
		t.Fatalf("only %d bad specs", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got := problemLines(t, data)
			golden(t, strings.TrimSuffix(f, ".json")+".errors", got)
		})
	}
}

func problemLines(t *testing.T, data []byte) []byte {
	t.Helper()
	_, err := spec.Parse(data)
	if err == nil {
		t.Fatal("bad spec accepted")
	}
	var ps spec.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("error is not Problems: %v", err)
	}
	var b bytes.Buffer
	for _, p := range ps {
		if p.Path == "" || p.Message == "" {
			t.Errorf("problem without path or message: %+v", p)
		}
		b.WriteString(p.String() + "\n")
	}
	return b.Bytes()
}

func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it):\n--- got\n%s--- want\n%s", path, got, want)
	}
}

func TestGeneratedLimits(t *testing.T) {
	base := `{"apiVersion":"raydrop.dev/v1","cluster":{"serviceAccount":"ray-sa","reservation":"r"},"output":{"bucket":"my-bucket"}}`
	notUTF8 := base[:len(base)-1] + `,"name":"caf`
	tests := []struct {
		name string
		data []byte
		want string
	}{
		{"over 256 KiB", []byte(`{"apiVersion":"raydrop.dev/v1","name":"` + strings.Repeat("a", spec.MaxBytes) + `"}`), "$: spec is 262185 bytes (at most 262144)"},
		{"10 MB", bytes.Repeat([]byte(" "), 10<<20), "$: spec is 10485760 bytes (at most 262144)"},
		{"not UTF-8", []byte(notUTF8 + "\xe9" + `"}`), fmt.Sprintf("$: not valid UTF-8 at byte %d (a spec must be UTF-8 JSON)", len(notUTF8))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.TrimSpace(string(problemLines(t, tt.data)))
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestProblemsListEveryField(t *testing.T) {
	data, err := os.ReadFile("testdata/bad/out-of-range.json")
	if err != nil {
		t.Fatal(err)
	}
	_, err = spec.Parse(data)
	var ps spec.Problems
	if !errors.As(err, &ps) {
		t.Fatalf("got %v", err)
	}
	want := []string{"training.epochs", "lora.r", "lora.dropout", "training.learningRate", "training.warmupRatio", "training.maxSeqLength", "cluster.workers.gpus", "limits.retries"}
	paths := map[string]bool{}
	for _, p := range ps {
		paths[p.Path] = true
	}
	for _, w := range want {
		if !paths[w] {
			t.Errorf("no problem reported for %s; got %v", w, ps)
		}
	}
}

func TestHashIgnoresNonTrainingFields(t *testing.T) {
	a := spec.Defaults()
	b := spec.Defaults()
	b.RunID, b.Schema = "other", "x.json"
	if a.Hash() != b.Hash() {
		t.Error("runId or $schema changed the spec hash")
	}
	b.Training.Epochs = 4
	if a.Hash() == b.Hash() {
		t.Error("epochs did not change the spec hash")
	}
}

// TestSchemaUpToDate keeps the checked-in JSON Schema equal to the one
// generated from the Go type (make schema rewrites it).
func TestSchemaUpToDate(t *testing.T) {
	golden(t, schemaFile, spec.Schema())
}

// TestSchemaAgreesWithValidator validates every example and the good specs
// against the generated schema with an independent JSON Schema validator,
// and checks that it also rejects every bad spec whose fault a schema can
// express.
func TestSchemaAgreesWithValidator(t *testing.T) {
	c := jsonschema.NewCompiler()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(spec.Schema()))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(spec.SchemaID, doc); err != nil {
		t.Fatal(err)
	}
	c.AssertFormat()
	sch, err := c.Compile(spec.SchemaID)
	if err != nil {
		t.Fatalf("schema does not compile: %v", err)
	}
	good, _ := filepath.Glob("testdata/good/*.json")
	examples, _ := filepath.Glob("../../examples/*.json")
	if len(examples) < 3 {
		t.Errorf("examples %v: want gemma3-vision.json, tutorial.json and shapes.json at least", examples)
	}
	good = append(good, examples...)
	for _, f := range good {
		if err := validateFile(sch, f); err != nil {
			t.Errorf("%s: schema rejects a valid spec: %v", f, err)
		}
	}
	// Faults that only code can see: several fields together, semantic
	// checks beyond a pattern, or what a parsed document no longer shows.
	codeOnly := map[string]bool{
		"bucket-google.json": true, "bucket-ip.json": true, "start-deadline-after-deadline.json": true,
		"replicas-inconsistent.json": true, "too-many-workers.json": true, "hf-token-in-spec.json": true,
		"duplicate-keys.json": true, "hf-repo-double-dash.json": true, "bad-durations.json": true,
		"bad-images.json": true, "bad-quantities.json": true, "capacity-tiers.json": true, "capacity-flex-start-gb200.json": true,
		"scratch-too-big.json": true, "scratch-default-too-big.json": true,
		"sweep-grid-too-big.json": true, "sweep-invalid-trials.json": true, "sweep-random.json": true, "sweep-without-parameters.json": true,
	}
	bad, _ := filepath.Glob("testdata/bad/*.json")
	for _, f := range bad {
		err := validateFile(sch, f)
		if err == nil && !codeOnly[filepath.Base(f)] {
			t.Errorf("%s: schema accepts a spec the validator rejects", f)
		}
	}
}

func validateFile(sch *jsonschema.Schema, f string) error {
	data, err := os.ReadFile(f)
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

// BenchmarkParse measures decoding and validating the example spec, the
// work Provision does per intake event.
func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile("../../examples/gemma3-vision.json")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := spec.Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTutorialSpec checks that examples/tutorial.json, the spec the README
// gives for the tutorial's own choices, sets each of them.
func TestTutorialSpec(t *testing.T) {
	data, err := os.ReadFile("../../examples/tutorial.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	tr := s.Training
	got := []any{s.Model.Quantization, s.Model.Attention, s.LoRA.VisionTower, s.LoRA.TrainEmbeddings,
		tr.PerDeviceBatchSize, tr.GradientAccumulationSteps, tr.GradientCheckpointing, tr.CompletionOnlyLoss, tr.MaxSeqLength}
	want := []any{"4bit", "eager", true, true, 1, 4, true, false, 512}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tutorial spec %v, want %v", got, want)
	}
}

// TestTiers: a reservation tier without a name takes cluster.reservation,
// and a spec recorded before cluster.capacity existed has the one default
// tier.
func TestTiers(t *testing.T) {
	s := spec.Defaults()
	s.Cluster.Reservation = "b200"
	s.Cluster.Capacity = []spec.Tier{{Type: spec.TierReservation, Wait: spec.Duration(time.Minute)}, {Type: spec.TierReservation, Reservation: "other"}}
	got := s.Tiers()
	if len(got) != 2 || got[0].Name() != "reservation b200" || got[1].Name() != "reservation other" || s.Cluster.Capacity[0].Reservation != "" {
		t.Errorf("tiers %+v (spec's own %+v)", got, s.Cluster.Capacity)
	}
	s.Cluster.Capacity = nil
	if got := s.Tiers(); len(got) != 1 || got[0].Name() != "reservation b200" {
		t.Errorf("a spec without capacity has tiers %+v, want the reservation", got)
	}
}

// TestExamples: every spec in examples/ is valid as the pipeline reads it,
// not only by the schema.
func TestExamples(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.json")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := spec.Parse(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestTierTypesEnum: the enum of cluster.capacity[].type is spec.TierTypes,
// in its order.
func TestTierTypesEnum(t *testing.T) {
	f, ok := reflect.TypeFor[spec.Tier]().FieldByName("Type")
	if !ok {
		t.Fatal("spec.Tier has no Type field")
	}
	var enum string
	for _, part := range strings.Split(f.Tag.Get("spec"), ",") {
		if v, ok := strings.CutPrefix(part, "enum="); ok {
			enum = v
		}
	}
	if want := strings.Join(spec.TierTypes, "|"); enum != want {
		t.Errorf("spec.Tier.Type's enum is %q, want spec.TierTypes %q", enum, want)
	}
}
