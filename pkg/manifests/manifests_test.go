package manifests_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"maps"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/trainer"
)

var update = flag.Bool("update", false, "rewrite golden files")

// fixedCode stands in for the embedded trainer so golden files do not change
// with every edit of the trainer.
var fixedCode = manifests.Code{
	Files: map[string]string{"train.py": "print('train')\n"},
	Hash:  "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
}

func exampleSpec(t testing.TB) *spec.JobSpec {
	t.Helper()
	return specFile(t, "../../examples/gemma3-vision.json")
}

// tieredSpec is a spec on four capacity tiers: two reservations,
// flex-start and Spot.
func tieredSpec(t testing.TB) *spec.JobSpec {
	t.Helper()
	return specFile(t, "../spec/testdata/good/capacity-tiers.json")
}

func specFile(t testing.TB, path string) *spec.JobSpec {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func exampleRun(s *spec.JobSpec) manifests.Run {
	return manifests.Run{ID: "gemma3-vision-0123456789ab", Attempt: 1, Source: "gs://intake/jobs/gemma3-vision.json#1", SpecHash: s.Hash()}
}

func TestGolden(t *testing.T) {
	s := exampleSpec(t)
	tests := []struct {
		name string
		run  manifests.Run
	}{
		{"example", exampleRun(s)},
		{"example-attempt-2", manifests.Run{ID: "gemma3-vision-0123456789ab", Attempt: 2, ResumeFrom: "gs://my-project-raydrop-checkpoints/raydrop/gemma3-vision-0123456789ab/attempt-1/TorchTrainer_1a2b3_00000_0_2026-11-30_10-00-00/checkpoint_000001/checkpoint", Source: "gs://intake/jobs/gemma3-vision.json#1", SpecHash: s.Hash()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := manifests.YAML(manifests.Objects(s, tt.run, fixedCode))
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "testdata/"+tt.name+".golden.yaml", out)
		})
	}
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
		t.Fatalf("%v (go test -update creates it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs (go test -update rewrites it):\n%s", path, got)
	}
}

// TestMatchesTutorial renders the example spec and compares it with the
// tutorial's RayCluster and RayJob field for field. The only differences
// allowed are the ones raydrop makes on purpose, each listed here.
func TestMatchesTutorial(t *testing.T) {
	s := exampleSpec(t)
	run := exampleRun(s)
	vars := map[string]string{
		"$RAY_SA":      s.Cluster.ServiceAccount,
		"$RESERVATION": s.Cluster.Reservation,
		"$GCS_BUCKET":  s.Output.Bucket,
	}

	t.Run("RayCluster", func(t *testing.T) {
		want := loadTutorial(t, "testdata/tutorial/ray_cluster.yaml", vars)
		got := toMap(t, manifests.RayCluster(s, fixedCode, 0))
		// Names aside: raydrop adds labels, an annotation and the namespace,
		// and names the code ConfigMap by its content hash (the tutorial's
		// fixed ray-job-cm would change code under a running job).
		stripMeta(got)
		stripMeta(want)
		cm := names.TrainerConfigMap(fixedCode.Hash)
		for _, group := range []string{"headGroupSpec", "workerGroupSpecs.0"} {
			setPath(t, want, "spec."+group+".template.spec.volumes.0.configMap.name", cm)
		}
		// raydrop puts the model cache and its node-local copies on the
		// local-SSD volume the tutorial already mounts: the env after the
		// token is its own.
		for _, c := range []string{"spec.headGroupSpec.template.spec.containers.0", "spec.workerGroupSpecs.0.template.spec.containers.0"} {
			env := get(t, got, c+".env").([]any)
			if len(env) != 3 || env[1].(map[string]any)["name"] != "HF_HOME" || env[2].(map[string]any)["name"] != "RAYDROP_SCRATCH" {
				t.Fatalf("%s env: %v", c, env)
			}
			setPath(t, got, c+".env", env[:1])
		}
		// The Ray log collector: a native sidecar on head and workers,
		// sharing /tmp/ray through its own emptyDir (the last volume and
		// mount).
		for _, g := range []string{"spec.headGroupSpec", "spec.workerGroupSpecs.0"} {
			init := get(t, got, g+".template.spec.initContainers").([]any)
			if len(init) != 1 || init[0].(map[string]any)["name"] != manifests.RayLogsContainer || init[0].(map[string]any)["restartPolicy"] != "Always" {
				t.Errorf("%s init containers = %v, want the %s sidecar alone", g, init, manifests.RayLogsContainer)
			}
			deletePath(got, g+".template.spec.initContainers")
			vols := get(t, got, g+".template.spec.volumes").([]any)
			ms := get(t, got, g+".template.spec.containers.0.volumeMounts").([]any)
			if v, m := vols[len(vols)-1].(map[string]any), ms[len(ms)-1].(map[string]any); v["name"] != "ray-logs" || m["name"] != "ray-logs" || m["mountPath"] != "/tmp/ray" {
				t.Errorf("%s: last volume %v and mount %v, want ray-logs at /tmp/ray", g, v, m)
			}
			setPath(t, got, g+".template.spec.volumes", vols[:len(vols)-1])
			setPath(t, got, g+".template.spec.containers.0.volumeMounts", ms[:len(ms)-1])
		}
		// The worker's preStop hook gives the trainer a preemption notice.
		deletePath(got, "spec.workerGroupSpecs.0.template.spec.containers.0.lifecycle")
		// The workers' scratch is sized for the model: the container asks
		// for it (Autopilot's default is 1 GiB), the volume is capped at it,
		// and it is on local SSD on B200 nodes.
		for _, r := range []string{"requests", "limits"} {
			p := "spec.workerGroupSpecs.0.template.spec.containers.0.resources." + r + ".ephemeral-storage"
			if got := get(t, got, p); got != spec.DefaultScratch(s.Model.ID) {
				t.Errorf("%s %v, want %s", p, got, spec.DefaultScratch(s.Model.ID))
			}
			deletePath(got, p)
		}
		if got := get(t, got, "spec.workerGroupSpecs.0.template.spec.volumes.1.emptyDir.sizeLimit"); got != spec.DefaultScratch(s.Model.ID) {
			t.Errorf("worker scratch volume sizeLimit %v", got)
		}
		deletePath(got, "spec.workerGroupSpecs.0.template.spec.volumes.1.emptyDir.sizeLimit")
		delete(get(t, got, "spec.workerGroupSpecs.0.template.spec.nodeSelector").(map[string]any), spec.NodeEphemeralLocalSSD)
		// KubeRay's typed WorkerGroupSpec always carries scaleStrategy.
		deletePath(got, "spec.workerGroupSpecs.0.scaleStrategy")
		// The tutorial's empty "metadata:" is null; the typed object's is {}.
		deletePath(got, "spec.headGroupSpec.template.metadata")
		deletePath(got, "spec.workerGroupSpecs.0.template.metadata")
		deletePath(want, "spec.headGroupSpec.template.metadata")
		compare(t, got, want)
	})

	t.Run("RayJob", func(t *testing.T) {
		want := loadTutorial(t, "testdata/tutorial/ray_job.yaml", vars)
		got := toMap(t, manifests.RayJob(s, run))
		stripMeta(got)
		stripMeta(want)
		// raydrop's own trainer replaces the tutorial's script (same job,
		// without its defects), so the entrypoint's arguments differ; both
		// run a Python script from the code mount.
		gotEP := get(t, got, "spec.entrypoint").(string)
		wantEP := get(t, want, "spec.entrypoint").(string)
		if !strings.HasPrefix(gotEP, "python "+manifests.ScriptPath+" ") || !strings.HasPrefix(wantEP, "python /code/") {
			t.Errorf("entrypoints do not both run a script from /code/: %q vs %q", gotEP, wantEP)
		}
		deletePath(got, "spec.entrypoint")
		deletePath(want, "spec.entrypoint")
		// A submission ID derived from the run, so a retried submitter
		// never starts the job twice.
		if get(t, got, "spec.jobId") != names.SubmissionID(run.ID, run.Attempt) {
			t.Errorf("jobId = %v", get(t, got, "spec.jobId"))
		}
		deletePath(got, "spec.jobId")
		// The runtime env adds the job supervisor's stop wait (so that a
		// stopped job's workers can save, TestRuntimeEnv) and the dataset
		// format (free text travels as data, never through the entrypoint's
		// shell); its pip list is the tutorial's.
		var gotEnv, wantEnv map[string]any
		for yml, into := range map[string]*map[string]any{get(t, got, "spec.runtimeEnvYAML").(string): &gotEnv, get(t, want, "spec.runtimeEnvYAML").(string): &wantEnv} {
			if err := yaml.Unmarshal([]byte(yml), into); err != nil {
				t.Fatal(err)
			}
		}
		// The attempt's evidence folder tells the Ray pods' log collectors
		// where this job's logs go; the stall window, the ranks' heartbeats
		// when to write their stacks unasked.
		wantEvidence := "gs://" + s.Output.Bucket + "/" + s.Output.Prefix + "/" + run.ID + "/evidence/attempt-1/"
		if vars, _ := gotEnv["env_vars"].(map[string]any); len(vars) != 5 || vars[manifests.DatasetFormatEnv] == nil || vars["RAY_JOB_STOP_WAIT_TIME_S"] == nil || vars[manifests.EvidenceEnv] != wantEvidence ||
			vars[manifests.StallAfterEnv] != "600" || vars[manifests.StallFactorEnv] != "5" {
			t.Errorf("runtime env variables = %v, want only %s, RAY_JOB_STOP_WAIT_TIME_S, %s=%s, %s=600 and %s=5", gotEnv["env_vars"], manifests.DatasetFormatEnv, manifests.EvidenceEnv, wantEvidence, manifests.StallAfterEnv, manifests.StallFactorEnv)
		}
		delete(gotEnv, "env_vars")
		if !reflect.DeepEqual(gotEnv, wantEnv) {
			t.Errorf("runtime env = %v, the tutorial's = %v", gotEnv, wantEnv)
		}
		deletePath(got, "spec.runtimeEnvYAML")
		deletePath(want, "spec.runtimeEnvYAML")
		compare(t, got, want)
	})
}

func loadTutorial(t *testing.T, path string, vars map[string]string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	for k, v := range vars {
		text = strings.ReplaceAll(text, k, v)
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(text), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func toMap(t *testing.T, o runtime.Object) map[string]any {
	t.Helper()
	out, err := manifests.YAML([]runtime.Object{o})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func stripMeta(m map[string]any) {
	meta := m["metadata"].(map[string]any)
	delete(meta, "name")
	delete(meta, "namespace")
	delete(meta, "labels")
	delete(meta, "annotations")
}

func walk(m map[string]any, path string, create bool) (map[string]any, string) {
	parts := strings.Split(path, ".")
	var cur any = m
	for _, p := range parts[:len(parts)-1] {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[p]
		case []any:
			i := 0
			for _, ch := range p {
				i = i*10 + int(ch-'0')
			}
			cur = c[i]
		}
	}
	mm, _ := cur.(map[string]any)
	return mm, parts[len(parts)-1]
}

func get(t *testing.T, m map[string]any, path string) any {
	t.Helper()
	parent, key := walk(m, path, false)
	if parent == nil {
		t.Fatalf("no %s", path)
	}
	return parent[key]
}

func setPath(t *testing.T, m map[string]any, path string, v any) {
	t.Helper()
	parent, key := walk(m, path, false)
	if parent == nil {
		t.Fatalf("no %s", path)
	}
	parent[key] = v
}

func deletePath(m map[string]any, path string) {
	if parent, key := walk(m, path, false); parent != nil {
		delete(parent, key)
	}
}

func compare(t *testing.T, got, want map[string]any) {
	t.Helper()
	if reflect.DeepEqual(got, want) {
		return
	}
	g, _ := yaml.Marshal(got)
	w, _ := yaml.Marshal(want)
	t.Errorf("rendered object differs from the tutorial's:\n--- raydrop\n%s--- tutorial\n%s", g, w)
}

// TestRuntimeEnv checks that the RayJob's pip list is the trainer's
// requirements file, line for line, and that Ray's job supervisor gives a
// stopped driver the time the trainer asks for to save (its default, 3 s,
// kills the driver before the workers have saved).
func TestRuntimeEnv(t *testing.T) {
	reqs := trainer.Requirements()
	if len(reqs) < 5 {
		t.Fatalf("requirements: %v", reqs)
	}
	var env struct {
		Pip     []string          `json:"pip"`
		EnvVars map[string]string `json:"env_vars"`
	}
	if err := yaml.Unmarshal([]byte(manifests.RuntimeEnvYAML(exampleSpec(t), manifests.Run{})), &env); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(env.Pip, reqs) {
		t.Errorf("runtime env pip = %v, requirements = %v", env.Pip, reqs)
	}
	wait := strconv.Itoa(manifests.StopWaitSeconds)
	if env.EnvVars["RAY_JOB_STOP_WAIT_TIME_S"] != wait {
		t.Errorf("runtime env RAY_JOB_STOP_WAIT_TIME_S = %q, want %s", env.EnvVars["RAY_JOB_STOP_WAIT_TIME_S"], wait)
	}
	py, err := os.ReadFile("../../trainer/notice.py")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(py), "\nSTOP_WAIT_S = "+wait+"\n") {
		t.Errorf("trainer/notice.py's STOP_WAIT_S is not %s", wait)
	}
	for _, r := range reqs {
		if !strings.Contains(r, "==") {
			t.Errorf("requirement %q is not pinned with ==", r)
		}
	}
}

// TestPreinstalledRunInstallsNothing: a run on the deployment's trainer
// image (its dependencies installed from the lock) renders no pip in its
// runtime env, and keeps the rest of it; the stock image keeps the pip list.
func TestPreinstalledRunInstallsNothing(t *testing.T) {
	s := exampleSpec(t)
	for _, tt := range []struct {
		run     manifests.Run
		wantPip bool
	}{
		{manifests.Run{ID: "r-1", Attempt: 1, Preinstalled: true}, false},
		{manifests.Run{ID: "r-1", Attempt: 1}, true},
	} {
		yml := manifests.RayJob(s, tt.run).Spec.RuntimeEnvYAML
		var env map[string]any
		if err := yaml.Unmarshal([]byte(yml), &env); err != nil {
			t.Fatal(err)
		}
		if _, has := env["pip"]; has != tt.wantPip {
			t.Errorf("preinstalled=%v: runtime env has pip %v, want %v:\n%s", tt.run.Preinstalled, has, tt.wantPip, yml)
		}
		vars, _ := env["env_vars"].(map[string]any)
		if vars["RAY_JOB_STOP_WAIT_TIME_S"] == nil || vars[manifests.DatasetFormatEnv] == nil {
			t.Errorf("preinstalled=%v: runtime env lost its variables:\n%s", tt.run.Preinstalled, yml)
		}
	}
}

func TestTrainerCode(t *testing.T) {
	code, err := manifests.TrainerCode()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := code.Files["train.py"]; !ok {
		t.Fatalf("train.py not embedded; files: %v", keys(code.Files))
	}
	size := 0
	for k, v := range code.Files {
		if strings.Contains(k, "/") {
			t.Errorf("embedded file %q is not flat (ConfigMap keys cannot hold '/')", k)
		}
		size += len(v)
	}
	// A ConfigMap holds at most 1 MiB.
	if size > 900<<10 {
		t.Errorf("trainer code is %d bytes, too close to the 1 MiB ConfigMap limit", size)
	}
	again, _ := manifests.TrainerCode()
	if again.Hash != code.Hash {
		t.Error("trainer code hash is not deterministic")
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestNamesWithinKubeRayLimits(t *testing.T) {
	s := exampleSpec(t)
	long := strings.Repeat("a", names.MaxRunIDLength)
	for attempt := 1; attempt <= s.Limits.Retries+10; attempt++ {
		job := manifests.RayJob(s, manifests.Run{ID: long, Attempt: attempt})
		if n := len(job.Name); n > 47 {
			t.Errorf("RayJob name %q is %d characters (KubeRay allows 47)", job.Name, n)
		}
	}
}

// TestFreeTextTravelsAsData: a template and a system message full of what a
// shell would act on never reach the entrypoint, and arrive byte for byte in
// the runtime env variable the trainer reads.
func TestFreeTextTravelsAsData(t *testing.T) {
	s := specFile(t, "../spec/testdata/good/own-data.json")
	s.Dataset.Template.System = "It's \"$(id)\" `uname` ; rm -rf / \n\ttabs — 日本語 $HOME"
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	ep := manifests.Entrypoint(s, exampleRun(s))
	for _, text := range []string{s.Dataset.Template.System, s.Dataset.Template.Prompt, "$(", "`"} {
		if strings.Contains(ep, text) {
			t.Errorf("entrypoint carries %q: %s", text, ep)
		}
	}
	checkArgv(t, s, exampleRun(s))
	var env struct {
		EnvVars map[string]string `json:"env_vars"`
	}
	if err := yaml.Unmarshal([]byte(manifests.RuntimeEnvYAML(s, manifests.Run{})), &env); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Format   string        `json:"format"`
		Template spec.Template `json:"template"`
	}
	if err := json.Unmarshal([]byte(env.EnvVars[manifests.DatasetFormatEnv]), &got); err != nil {
		t.Fatal(err)
	}
	if got.Format != "template" || !reflect.DeepEqual(got.Template, s.Dataset.Template) {
		t.Errorf("runtime env carries %+v, want %+v", got.Template, s.Dataset.Template)
	}
	if !slices.Contains(manifests.TrainerArgs(s, exampleRun(s)), "gs://my-data/receipts") {
		t.Errorf("the trainer is not given dataset.source: %v", manifests.TrainerArgs(s, exampleRun(s)))
	}
}

// TestEntrypointSplitsAsArgv runs the rendered entrypoint through bash, the
// way KubeRay's submitter does, and again through the shell that Ray's job
// manager uses on the joined words, and checks both see the intended argv.
func TestEntrypointSplitsAsArgv(t *testing.T) {
	s := exampleSpec(t)
	run := exampleRun(s)
	checkArgv(t, s, run)
}

// FuzzEntrypoint sets a spec field to arbitrary text. Whenever the spec still
// validates, the entrypoint must split into exactly the intended argv under
// both shells, and never carry anything shaped like a token.
func FuzzEntrypoint(f *testing.F) {
	seeds := []string{"train", "a b", "$(id)", "`id`", "x;y", "a'b", `a"b`, "*", "~", "a\nb", "-rf", "hf_abcdefghijklmnopqrstuvwxyz0123456789", "{a,b}", "a=b", "!!", "\\", ""}
	for i, s := range seeds {
		f.Add(uint8(i), s)
	}
	f.Fuzz(func(t *testing.T, field uint8, value string) {
		s := spec.Defaults()
		s.Cluster.ServiceAccount, s.Cluster.Reservation, s.Output.Bucket = "ray-sa", "res", "my-bucket"
		run := manifests.Run{ID: "run-1", Attempt: 1}
		switch field % 11 {
		case 9:
			s.Dataset.Source = value
		case 10:
			s.Dataset.Revision = value
		case 0:
			s.Model.ID = value
		case 1:
			s.Dataset.ID = value
		case 2:
			s.Dataset.Split = value
		case 3:
			s.LoRA.TargetModules = value
		case 4:
			s.Training.AcceleratorType = value
		case 5:
			s.Output.Prefix = value
		case 6:
			s.Output.Bucket = value
		case 7:
			s.Training.LRScheduler = value
		case 8:
			run.ResumeFrom = value // not a spec field: quoting alone must hold
		}
		if s.Validate() != nil || run.Validate() != nil {
			return
		}
		if spec.LooksLikeSecret(manifests.Entrypoint(&s, run)) {
			t.Fatalf("entrypoint carries a token-shaped string: %q", manifests.Entrypoint(&s, run))
		}
		checkArgv(t, &s, run)
	})
}

func checkArgv(t *testing.T, s *spec.JobSpec, run manifests.Run) {
	t.Helper()
	ep := manifests.Entrypoint(s, run)
	want := append([]string{"python"}, manifests.TrainerArgs(s, run)...)
	first := shellSplit(t, ep)
	if !reflect.DeepEqual(first, want) {
		t.Fatalf("bash splits the entrypoint into\n%q\nwant\n%q", first, want)
	}
	second := shellSplit(t, strings.Join(first, " "))
	if !reflect.DeepEqual(second, want) {
		t.Fatalf("re-splitting the joined argv gives\n%q\nwant\n%q", second, want)
	}
}

// shellSplit asks bash how it splits cmd: python is a function that prints
// its arguments, so nothing runs.
func shellSplit(t *testing.T, cmd string) []string {
	t.Helper()
	script := `python() { printf 'python\0'; printf '%s\0' "$@"; }; ` + cmd
	out, err := exec.Command("bash", "-c", script).Output()
	if err != nil {
		t.Fatalf("bash -c %q: %v", cmd, err)
	}
	parts := strings.Split(string(out), "\x00")
	return parts[:len(parts)-1]
}

// BenchmarkObjects measures rendering a run's three objects to YAML, the
// work Provision and Submit do per run.
func BenchmarkObjects(b *testing.B) {
	s := exampleSpec(b)
	run := exampleRun(s)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := manifests.YAML(manifests.Objects(s, run, fixedCode)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestNoticeFileIsTheTrainers: the preStop hook leaves the notice where the
// trainer looks by default.
func TestNoticeFileIsTheTrainers(t *testing.T) {
	py, err := os.ReadFile("../../trainer/notice.py")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(py), `DEFAULT_NOTICE = "`+manifests.NoticeFile+`"`) {
		t.Errorf("trainer/notice.py's DEFAULT_NOTICE is not %s", manifests.NoticeFile)
	}
}

// TestWorkerPlacement checks the node selector and tolerations of each
// capacity tier, and that a tier past the last stays on the last.
func TestWorkerPlacement(t *testing.T) {
	s := tieredSpec(t)
	base := map[string]string{names.NodeAccelerator: "nvidia-b200", "cloud.google.com/gke-gpu-driver-version": "latest", spec.NodeEphemeralLocalSSD: "true"}
	with := func(kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	spot := []corev1.Toleration{{Key: names.NodeSpot, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	tests := []struct {
		tier int
		sel  map[string]string
		tol  []corev1.Toleration
	}{
		{0, with(names.NodeReservation, "b200-reservation", names.NodeReservationAffinity, "specific"), nil},
		{1, with(names.NodeReservation, "b200-second", names.NodeReservationAffinity, "specific", names.NodeReservationProject, "central-gpu-pool"), nil},
		{2, with(names.NodeFlexStart, "true"), nil},
		{3, with(names.NodeSpot, "true"), spot},
		{9, with(names.NodeSpot, "true"), spot},
	}
	for _, tt := range tests {
		sel, tol := manifests.WorkerPlacement(s, tt.tier)
		if !reflect.DeepEqual(sel, tt.sel) || !reflect.DeepEqual(tol, tt.tol) {
			t.Errorf("tier %d: selector %v tolerations %v, want %v %v", tt.tier, sel, tol, tt.sel, tt.tol)
		}
		rc := manifests.RayCluster(s, fixedCode, tt.tier)
		if got := rc.Spec.WorkerGroupSpecs[0].Template.Spec.NodeSelector; !reflect.DeepEqual(got, tt.sel) {
			t.Errorf("tier %d: RayCluster worker selector %v", tt.tier, got)
		}
	}
}

// TestWorkerScratch: the worker container requests and is limited to the
// scratch size, the scratch volume is capped at it, and it is sized from
// the model unless the spec says.
func TestWorkerScratch(t *testing.T) {
	tests := []struct{ model, scratch, want string }{
		{"google/gemma-3-1b-it", "", "72Gi"},
		{"google/gemma-3-4b-it", "", "97Gi"},
		{"google/gemma-3-12b-it", "", "155Gi"},
		{"google/gemma-3-27b-it", "", "269Gi"},
		{"example/no-size-in-name", "", "303Gi"},
		{"google/gemma-3-4b-it", "500Gi", "500Gi"},
	}
	for _, tt := range tests {
		s := exampleSpec(t)
		s.Model.ID, s.Cluster.Workers.Scratch = tt.model, tt.scratch
		pod := manifests.RayCluster(s, fixedCode, 0).Spec.WorkerGroupSpecs[0].Template.Spec
		res := pod.Containers[0].Resources
		req, lim := res.Requests[corev1.ResourceEphemeralStorage], res.Limits[corev1.ResourceEphemeralStorage]
		var size string
		for _, v := range pod.Volumes {
			if v.EmptyDir != nil && v.EmptyDir.SizeLimit != nil {
				size = v.EmptyDir.SizeLimit.String()
			}
		}
		if req.String() != tt.want || lim.String() != tt.want || size != tt.want {
			t.Errorf("%s scratch %q: request %s limit %s volume %q, want %s", tt.model, tt.scratch, req.String(), lim.String(), size, tt.want)
		}
	}
}

// TestTierTable: every capacity tier type of spec.TierTypes renders a
// placement that reads back as that type, and as no other tier's: a type
// added to the spec without a row in the placement table fails here.
func TestTierTable(t *testing.T) {
	s := tieredSpec(t)
	s.Cluster.Capacity = nil
	for _, typ := range spec.TierTypes {
		tier := spec.Tier{Type: typ}
		if typ == spec.TierReservation {
			tier.Reservation = "r"
		}
		s.Cluster.Capacity = append(s.Cluster.Capacity, tier)
	}
	for i, typ := range spec.TierTypes {
		sel, _ := manifests.WorkerPlacement(s, i)
		if got := manifests.TierType(sel); got != typ {
			t.Errorf("tier type %s renders %v, which reads back as %s", typ, sel, got)
		}
		for j := range spec.TierTypes {
			if on := manifests.OnTier(s, j, sel); on != (i == j) {
				t.Errorf("a pod of tier %s on tier %s: %v", typ, spec.TierTypes[j], on)
			}
		}
	}
}

// TestOnTier: a pod is on the tier whose distinguishing node selector keys
// it carries, whatever keys GKE added beside them, and on no other.
func TestOnTier(t *testing.T) {
	s := tieredSpec(t) // reservation, shared reservation of another project, flexStart, spot
	onDemand := tieredSpec(t)
	onDemand.Cluster.Workers.Accelerator = "nvidia-h100-80gb"
	onDemand.Cluster.Capacity = append(onDemand.Cluster.Capacity[2:], spec.Tier{Type: spec.TierOnDemand})
	added := map[string]string{"cloud.google.com/compute-class": "Accelerator", "kubernetes.io/arch": "amd64", spec.NodeEphemeralLocalSSD: "true", "cloud.google.com/gke-gpu-driver-version": "default"}
	with := func(s *spec.JobSpec, tier int, extra map[string]string, drop ...string) map[string]string {
		sel, _ := manifests.WorkerPlacement(s, tier)
		maps.Copy(sel, extra)
		for _, k := range drop {
			delete(sel, k)
		}
		return sel
	}
	tests := []struct {
		name string
		s    *spec.JobSpec
		sel  map[string]string
		want int // the one tier the pod is on, -1 for none
	}{
		{"reservation as rendered", s, with(s, 0, nil), 0},
		{"reservation with keys GKE added", s, with(s, 0, added), 0},
		{"shared reservation with keys GKE added", s, with(s, 1, added), 1},
		{"shared reservation without its project", s, with(s, 1, added, names.NodeReservationProject), -1},
		{"flexStart with keys GKE added", s, with(s, 2, added), 2},
		{"spot with keys GKE added", s, with(s, 3, added), 3},
		{"another reservation", s, with(s, 0, map[string]string{names.NodeReservation: "elsewhere"}), -1},
		{"spot and flexStart at once", s, with(s, 3, map[string]string{names.NodeFlexStart: "true"}), -1},
		{"onDemand with keys GKE added", onDemand, with(onDemand, 2, added), 2},
		{"flexStart is not onDemand", onDemand, with(onDemand, 0, added), 0},
		{"spot is not onDemand", onDemand, with(onDemand, 1, added), 1},
	}
	for _, tt := range tests {
		got := -1
		for i := range tt.s.Tiers() {
			if manifests.OnTier(tt.s, i, tt.sel) {
				if got >= 0 {
					t.Errorf("%s: on tiers %d and %d", tt.name, got, i)
				}
				got = i
			}
		}
		if got != tt.want {
			t.Errorf("%s: on tier %d, want %d (selector %v)", tt.name, got, tt.want, tt.sel)
		}
		if got >= 0 && manifests.TierType(tt.sel) != tt.s.Tier(got).Type {
			t.Errorf("%s: TierType %s, want %s", tt.name, manifests.TierType(tt.sel), tt.s.Tier(got).Type)
		}
	}
}

// TestPtrace: cluster.ptrace gives the GPU worker containers SYS_PTRACE and
// tells their heartbeats py-spy may run; off (the default), neither.
func TestPtrace(t *testing.T) {
	for _, on := range []bool{false, true} {
		s := exampleSpec(t)
		s.Cluster.Ptrace = on
		rc := manifests.RayCluster(s, fixedCode, 0)
		w := rc.Spec.WorkerGroupSpecs[0].Template.Spec.Containers[0]
		added := w.SecurityContext != nil && w.SecurityContext.Capabilities != nil && slices.Equal(w.SecurityContext.Capabilities.Add, []corev1.Capability{"SYS_PTRACE"})
		env := slices.ContainsFunc(w.Env, func(e corev1.EnvVar) bool { return e.Name == manifests.PySpyEnv && e.Value == "1" })
		if added != on || env != on {
			t.Errorf("ptrace %v: SYS_PTRACE added %v, %s set %v", on, added, manifests.PySpyEnv, env)
		}
		if h := rc.Spec.HeadGroupSpec.Template.Spec.Containers[0]; h.SecurityContext != nil {
			t.Errorf("ptrace %v: the head got a security context %+v", on, h.SecurityContext)
		}
	}
}

// TestQueuedRayJob: where Kueue admits runs, an attempt's RayJob embeds the
// run's own RayCluster (the one the spec's cluster would be, on the
// attempt's tier) instead of a clusterSelector, is shut down after a delay
// that leaves time to keep its evidence, is created suspended with its
// queue and priority labels, and passes KubeRay v1.5.0's own validation of
// a RayJob (which refuses to suspend one with a clusterSelector, or one
// that does not shut down its cluster).
func TestQueuedRayJob(t *testing.T) {
	s := exampleSpec(t)
	run := exampleRun(s)
	run.Tier = 1
	job := manifests.QueuedRayJob(s, run, fixedCode, "team-a", "production")
	plain := manifests.RayJob(s, run)
	if job.Spec.ClusterSelector != nil || job.Spec.RayClusterSpec == nil {
		t.Fatalf("clusterSelector %v, rayClusterSpec %v: want the cluster embedded", job.Spec.ClusterSelector, job.Spec.RayClusterSpec)
	}
	if want := manifests.RayCluster(s, fixedCode, 1).Spec; !equality.Semantic.DeepEqual(*job.Spec.RayClusterSpec, want) {
		t.Error("the embedded cluster is not the spec's RayCluster on the attempt's tier")
	}
	if !job.Spec.Suspend || !job.Spec.ShutdownAfterJobFinishes || job.Spec.TTLSecondsAfterFinished != manifests.QueuedTTL {
		t.Errorf("suspend %v, shutdownAfterJobFinishes %v, ttl %d", job.Spec.Suspend, job.Spec.ShutdownAfterJobFinishes, job.Spec.TTLSecondsAfterFinished)
	}
	if job.Labels[manifests.LabelQueueName] != "team-a" || job.Labels[manifests.LabelPriorityClass] != "production" {
		t.Errorf("labels %v", job.Labels)
	}
	if job.Name != plain.Name || job.Spec.Entrypoint != plain.Spec.Entrypoint || job.Spec.JobId != plain.Spec.JobId || job.Spec.RuntimeEnvYAML != plain.Spec.RuntimeEnvYAML {
		t.Error("name, entrypoint, submission ID or runtime env differ from the attempt's RayJob")
	}
	if _, ok := manifests.QueuedRayJob(s, run, fixedCode, "team-a", "").Labels[manifests.LabelPriorityClass]; ok {
		t.Error("a priority label without a priority")
	}
	if err := utils.ValidateRayJobSpec(job); err != nil {
		t.Errorf("KubeRay refuses it: %v", err)
	}
	plain.Spec.Suspend = true
	if err := utils.ValidateRayJobSpec(plain); err == nil {
		t.Error("KubeRay accepts a suspended RayJob with a clusterSelector: the check above cannot fail")
	}
}
