package proof_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
)

// deliveries keeps what the Eventarc adapter did, by route and event ID
// and by route and subject.
var deliveries = struct {
	sync.Mutex
	by map[string][]eventarc.Delivery
}{by: map[string][]eventarc.Delivery{}}

func observe(d eventarc.Delivery) {
	deliveries.Lock()
	defer deliveries.Unlock()
	deliveries.by[d.Route+"|id|"+d.Event.ID()] = append(deliveries.by[d.Route+"|id|"+d.Event.ID()], d)
	if s := d.Event.Subject(); s != "" {
		deliveries.by[d.Route+"|subject|"+s] = append(deliveries.by[d.Route+"|subject|"+s], d)
	}
}

// deliveredOnce waits for the route's first delivery under key that a
// running function answered, lets redeliveries come for settle, and returns
// a problem unless there was exactly one such delivery, answered 2xx: no
// retry storm.
func deliveredOnce(route, key string, settle time.Duration) string {
	// A push that got no answer while the crash scenarios running beside
	// this one had killed the function is Pub/Sub's redelivery at work,
	// not a retry of the input: it is set aside (the redelivery comes after
	// the subscription's backoff), and the rest must be one delivery
	// answered 2xx.
	fn := stack.RouteFunction(route)
	answeredOf := func() (got, answered []eventarc.Delivery) {
		deliveries.Lock()
		got = slices.Clone(deliveries.by[route+"|"+key])
		deliveries.Unlock()
		for _, d := range got {
			if d.Code == 0 && d.Err != nil && st.DownDuring(fn, d.Start, d.Start.Add(d.Took)) {
				continue
			}
			answered = append(answered, d)
		}
		return got, answered
	}
	// Deliveries queue behind the other scenarios' (the emulator pushes two
	// at a time per subscription): the first may take a while.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, answered := answeredOf()
		if len(answered) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("no delivery on %s for %s answered within 2 min (%d while %s was killed)", route, key, len(got), fn)
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(settle)
	got, answered := answeredOf()
	var codes []int
	for _, d := range got {
		codes = append(codes, d.Code)
	}
	if len(answered) != 1 || answered[0].Outcome != eventarc.Delivered || answered[0].Code < 200 || answered[0].Code > 299 {
		return fmt.Sprintf("%s on %s: %d deliveries answered %v (%d of them while %s was killed), want one answered 2xx", key, route, len(got), codes, len(got)-len(answered), fn)
	}
	return ""
}

// badCase is one kind of bad input from testdata/badinput/cases.json.
type badCase struct {
	Name       string            `json:"name"`
	Via        string            `json:"via"` // object, request, step or direct
	Object     string            `json:"object"`
	Topic      string            `json:"topic"`
	Function   string            `json:"function"`
	CEType     string            `json:"ceType"`
	CESource   string            `json:"ceSource"`
	Data       string            `json:"data"` // @valid, @10MB, @9.9MB or literal
	Attributes map[string]string `json:"attributes"`
	Expect     string            `json:"expect"` // rejected, ignored, refused (4xx) or unpublishable
	Problem    string            `json:"problem"`
}

func (c badCase) data(t *testing.T) []byte {
	switch c.Data {
	case "@valid":
		return spec(t, "never-runs", nil)
	case "@10MB":
		return padded(10 << 20)
	case "@9.9MB":
		return padded(9_900_000)
	}
	return []byte(c.Data)
}

// padded is a spec of n bytes, its name field padded out.
func padded(n int) []byte {
	head, tail := `{"apiVersion": "raydrop.dev/v1", "name": "`, `"}`
	return []byte(head + strings.Repeat("a", n-len(head)-len(tail)) + tail)
}

// stepRoute is the route that delivers a stage topic's messages.
var stepRoute = map[string]string{
	stack.Topics.Provisioned: "submit", stack.Topics.Submitted: "monitor-submitted",
	stack.Topics.Finished: "finalize", stack.Topics.Ticks: "monitor-ticks",
}

// testBadInput puts every kind of bad input through the deployed path: the
// bad specs of pkg/spec's testdata as objects and as requests, the delivery
// cases of testdata/badinput, and shell syntax in every string field of the
// spec. Each is rejected with its precise problems or ignored, delivered
// once and answered 2xx (never retried), and starts nothing.
func testBadInput(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	files, err := filepath.Glob("../../../pkg/spec/testdata/bad/*.json")
	if err != nil || len(files) < 30 {
		t.Fatalf("bad specs: %d, %v", len(files), err)
	}
	for _, f := range files {
		wg.Go(func() { badSpec(t, f) })
	}
	b, err := os.ReadFile("testdata/badinput/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []badCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		wg.Go(func() { badDelivery(t, c) })
	}
	wg.Go(func() { shellInEveryField(t) })
	wg.Go(func() { freeTextArrivesAsData(t) })
	wg.Go(func() { outsideTheDeployment(t) })
	wg.Wait()
}

// outsideTheDeployment: a spec naming a checkpoint bucket the deployment
// does not let runs write (its functions could never read what the run
// wrote), or a namespace where the functions hold no Role, is rejected at
// admission, naming the field and what is allowed.
func outsideTheDeployment(t *testing.T) {
	for _, c := range []struct{ scenario, name, path, value, allowed string }{
		{"bad input: a checkpoint bucket outside the deployment", "foreign-bucket", "output.bucket", "someone-elses-checkpoints", output},
		{"bad input: a namespace outside the deployment", "foreign-namespace", "cluster.namespace", "kube-system", stack.Namespace},
	} {
		var m map[string]any
		if err := json.Unmarshal(spec(t, c.name, nil), &m); err != nil {
			t.Fatal(err)
		}
		setPath(m, c.path, c.value)
		data, _ := json.Marshal(m)
		runID := upload(t, c.name, data, "")
		own(runID, c.scenario)
		var problems []string
		rec, err := probe.WaitPhase(context.Background(), st, runID, 2*time.Minute, probe.Ended...)
		switch {
		case err != nil:
			problems = append(problems, err.Error())
		case rec.Phase != runs.Rejected || rec.Reason != runs.InvalidSpec || len(rec.Problems) != 1 ||
			rec.Problems[0].Path != c.path || !strings.Contains(rec.Problems[0].Message, c.allowed):
			problems = append(problems, fmt.Sprintf("run ended %s (%s) with problems %v; want REJECTED naming %s and %s", rec.Phase, rec.Reason, rec.Problems, c.path, c.allowed))
		}
		report.Add(c.scenario, 0, 0, problems...)
		for _, p := range problems {
			t.Error(p)
		}
	}
}

// badSpec uploads one bad spec and publishes it as a request: both runs end
// REJECTED with exactly the problems pkg/spec's golden file lists.
func badSpec(t *testing.T, file string) {
	base := strings.TrimSuffix(filepath.Base(file), ".json")
	scenario := "bad input: specs (pkg/spec testdata)"
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	golden, err := os.ReadFile(strings.TrimSuffix(file, ".json") + ".errors")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimSpace(string(golden))
	ctx := context.Background()
	name := "bad-" + base
	runID := upload(t, name, data, "")
	check := func(runID, route, key, via string) {
		var problems []string
		rec, err := probe.WaitPhase(ctx, st, runID, 2*time.Minute, runs.Rejected)
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s (%s): %v", base, via, err))
		} else {
			var got []string
			for _, p := range rec.Problems {
				got = append(got, p.String())
			}
			if g := strings.Join(got, "\n"); g != want {
				problems = append(problems, fmt.Sprintf("%s (%s): problems\n%s\nwant\n%s", base, via, g, want))
			}
		}
		if p := deliveredOnce(route, key, 3*time.Second); p != "" {
			problems = append(problems, base+": "+p)
		}
		// Events reach a subscriber a little after the record is written.
		seen, _ := evs.WaitTerminal(runID, time.Minute, time.Second)
		if probe.Count(seen, "rejected") != 1 || len(seen) != 1 {
			problems = append(problems, fmt.Sprintf("%s (%s): events %d, want one rejected", base, via, len(seen)))
		}
		if n := len(jobs.Of(runID)); n != 0 {
			problems = append(problems, fmt.Sprintf("%s (%s): %d RayJobs", base, via, n))
		}
		own(runID, scenario)
		report.Add(scenario, 0, 0, problems...)
		for _, p := range problems {
			t.Error(p)
		}
	}
	check(runID, "provision-intake", "subject|objects/jobs/"+name+".json", "object")
	if bytes.Contains(data, []byte(`"runId"`)) {
		return // the request's run ID would be the spec's
	}
	// Pub/Sub refuses a message with neither data nor attributes.
	msgID := requestWith(t, data, map[string]string{"origin": "raydrop-proof"})
	check(runIDOf(msgID), "provision-requests", "id|"+msgID, "request")
}

// badDelivery runs one case of testdata/badinput.
func badDelivery(t *testing.T, c badCase) {
	scenario := "bad input: deliveries (testdata/badinput)"
	ctx := context.Background()
	var problems []string
	fail := func(format string, args ...any) {
		problems = append(problems, c.Name+": "+fmt.Sprintf(format, args...))
	}
	data := c.data(t)
	runID, route, key := "", "", ""
	switch c.Via {
	case "object":
		object := strings.Replace(c.Object, "@long", strings.Repeat("long-", 180), 1)
		w := st.GCS.Bucket(stack.IntakeBucket).Object(object).NewWriter(ctx)
		if _, err := w.Write(data); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatalf("%s: upload: %v", c.Name, err)
		}
		runID = names.RunIDFromObject(stack.IntakeBucket, object, w.Attrs().Generation)
		route, key = "provision-intake", "subject|objects/"+object
	case "request", "step":
		topic := c.Topic
		route = stepRoute[topic]
		if c.Via == "request" {
			topic, route = stack.Topics.Requests, "provision-requests"
		}
		pub := st.PS.Publisher(topic)
		msgID, err := pub.Publish(ctx, &pubsub.Message{Data: data, Attributes: c.Attributes}).Get(ctx)
		pub.Stop()
		if c.Expect == "unpublishable" {
			// Pub/Sub itself refuses it: nothing reaches a function.
			if err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
				fail("published (%v), want Pub/Sub to refuse it", err)
			}
			route = ""
			break
		}
		if err != nil {
			t.Fatalf("%s: publish: %v", c.Name, err)
		}
		runID, key = runIDOf(msgID), "id|"+msgID
	case "direct":
		code, err := postWhileUp(c, data)
		switch {
		case err != nil:
			fail("post: %v", err)
		case c.Expect == "refused" && (code < 400 || code > 499):
			fail("answered %d, want 4xx", code)
		case c.Expect == "ignored" && (code < 200 || code > 299):
			fail("answered %d, want 2xx (acknowledged, not retried)", code)
		}
	default:
		t.Fatalf("%s: unknown via %q", c.Name, c.Via)
	}
	if route != "" {
		if p := deliveredOnce(route, key, 3*time.Second); p != "" {
			fail("%s", p)
		}
	}
	own(runID, scenario)
	switch c.Expect {
	case "rejected":
		rec, err := probe.WaitPhase(ctx, st, runID, 2*time.Minute, runs.Rejected)
		if err != nil {
			fail("%v", err)
			break
		}
		found := false
		for _, p := range rec.Problems {
			found = found || strings.Contains(p.String(), c.Problem)
		}
		if !found {
			fail("problems %v do not say %q", rec.Problems, c.Problem)
		}
		seen, _ := evs.WaitTerminal(runID, time.Minute, time.Second)
		if n := probe.Count(seen, "rejected"); n != 1 {
			fail("%d rejected events", n)
		}
	case "ignored", "refused":
		if runID != "" && c.Object != "runs/forged/status.json" {
			if _, err := probe.Runs(st).Get(ctx, runID); !errors.Is(err, runs.ErrNotFound) {
				fail("a run record exists for ignored input (err %v)", err)
			}
		}
	}
	if runID != "" && len(jobs.Of(runID)) != 0 {
		fail("a RayJob was created")
	}
	report.Add(scenario, 0, 0, problems...)
	for _, p := range problems {
		t.Error(p)
	}
}

// postWhileUp posts the event as postEvent does, and posts it again when
// the post got no answer while the crash scenarios running beside this
// one had killed the function (as a trigger would redeliver it); any
// other failure, or one that lasts 2 min, is the answer.
func postWhileUp(c badCase, data []byte) (int, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		start := time.Now()
		code, err := postEvent(c, data)
		if err == nil || !st.DownDuring(c.Function, start, time.Now()) || time.Now().After(deadline) {
			return code, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// postEvent posts a CloudEvent (or, without a type, a plain JSON body)
// straight to a function, as a misconfigured trigger would.
func postEvent(c badCase, data []byte) (int, error) {
	req, err := http.NewRequest(http.MethodPost, st.URL(c.Function), bytes.NewReader(data))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.CEType != "" {
		req.Header.Set("ce-specversion", "1.0")
		req.Header.Set("ce-id", "proof-"+strings.ReplaceAll(c.Name, " ", "-"))
		req.Header.Set("ce-type", c.CEType)
		req.Header.Set("ce-source", c.CESource)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// canary is a file any shell that ran an injected command would create.
var canary = filepath.Join(os.TempDir(), "raydrop-proof-canary")

// shellPayloads are the injections tried in every string field.
var shellPayloads = []string{"$(touch " + canary + ")", "`touch " + canary + "`", "x'; touch " + canary + "; echo '"}

// shellInEveryField sets each string field of the spec, one at a time, to
// each payload: the run is rejected naming that field, or, where the field
// takes any text, runs with it (its entrypoint goes to the shell check).
func shellInEveryField(t *testing.T) {
	scenario := "bad input: shell syntax in every string field"
	fields := stringFields(t)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for f, field := range fields {
		for i, payload := range shellPayloads {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				var m map[string]any
				if err := json.Unmarshal(spec(t, fmt.Sprintf("shell-%d-%d", f, i), nil), &m); err != nil {
					t.Error(err)
					return
				}
				setPath(m, field, payload)
				data, _ := json.Marshal(m)
				name := fmt.Sprintf("shell-%s-%d", strings.NewReplacer(".", "-", "$", "").Replace(field), i)
				runID := upload(t, name, data, "")
				own(runID, scenario)
				rec, err := probe.WaitPhase(context.Background(), st, runID, 3*time.Minute, probe.Ended...)
				var problems []string
				switch {
				case err != nil:
					problems = append(problems, err.Error())
				case rec.Phase == runs.Rejected:
					named := false
					for _, p := range rec.Problems {
						named = named || p.Path == field
					}
					if !named {
						problems = append(problems, fmt.Sprintf("%s=%q rejected without naming the field: %v", field, payload, rec.Problems))
					}
				case rec.Phase != runs.Succeeded:
					problems = append(problems, fmt.Sprintf("%s=%q: run ended %s (%s)", field, payload, rec.Phase, rec.Message))
				default:
					report.Note(scenario, fmt.Sprintf("%s takes any text: %q ran, its entrypoint is checked by the shell test", field, payload))
				}
				report.Add(scenario, 0, 0, problems...)
				for _, p := range problems {
					t.Error(p)
				}
			})
		}
	}
	wg.Wait()
}

// freeTextArrivesAsData: a template and a system message holding quotes,
// $(...), backticks, newlines and non-ASCII text are data: the run trains,
// no injected command runs (the shell test) in the real data check's
// Python either, and the text reaches the trainer byte for byte in the
// RayJob's runtime env, never its entrypoint.
func freeTextArrivesAsData(t *testing.T) {
	scenario := "bad input: free text in templates arrives byte for byte"
	system := "It's \"$(touch " + canary + ")\" `touch " + canary + "`\n\ttabs; café — 日本語 'q' \\ $HOME"
	prompt := "{Product Name}\nAnswer in one line, {{like this}}: x'; touch " + canary + "; echo '"
	tpl := map[string]any{"system": system, "prompt": prompt, "answer": "description", "images": []string{"image"}}
	var m map[string]any
	if err := json.Unmarshal(spec(t, "free-text", map[string]any{"dataset": map[string]any{"template": tpl, "check": true}}), &m); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(m)
	runID := upload(t, "free-text", data, "")
	own(runID, scenario)
	var problems []string
	rec, err := probe.WaitPhase(context.Background(), st, runID, 3*time.Minute, probe.Ended...)
	switch {
	case err != nil:
		problems = append(problems, err.Error())
	case rec.Phase != runs.Succeeded:
		problems = append(problems, fmt.Sprintf("run ended %s (%s)", rec.Phase, rec.Message))
	default:
		job, err := ray.RayV1().RayJobs("default").Get(context.Background(), names.RayJob(runID, 1), metav1.GetOptions{})
		if err != nil {
			problems = append(problems, err.Error())
			break
		}
		var env struct {
			EnvVars map[string]string `json:"env_vars"`
		}
		var got struct {
			Template struct {
				System string `json:"system"`
				Prompt string `json:"prompt"`
			} `json:"template"`
		}
		if err := yaml.Unmarshal([]byte(job.Spec.RuntimeEnvYAML), &env); err != nil {
			problems = append(problems, "runtime env: "+err.Error())
		} else if err := json.Unmarshal([]byte(env.EnvVars[manifests.DatasetFormatEnv]), &got); err != nil {
			problems = append(problems, "dataset format: "+err.Error())
		}
		if got.Template.System != system || got.Template.Prompt != prompt {
			problems = append(problems, fmt.Sprintf("the trainer is given system %q and prompt %q, want %q and %q", got.Template.System, got.Template.Prompt, system, prompt))
		}
		for _, text := range []string{"$(", "`", "café", "like this"} {
			if strings.Contains(job.Spec.Entrypoint, text) {
				problems = append(problems, fmt.Sprintf("the entrypoint carries %q: %s", text, job.Spec.Entrypoint))
			}
		}
		if len(problems) == 0 {
			report.Note(scenario, "the system message and the prompt reached the trainer byte for byte, in the runtime env; the entrypoint carries neither")
		}
	}
	report.Add(scenario, 0, 0, problems...)
	for _, p := range problems {
		t.Error(p)
	}
}

// stringFields lists the dotted paths of every string field in the job
// spec's JSON Schema.
func stringFields(t *testing.T) []string {
	b, err := os.ReadFile("../../../schemas/jobspec.v1.json")
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(node map[string]any, path string)
	walk = func(node map[string]any, path string) {
		switch node["type"] {
		case "object":
			props, _ := node["properties"].(map[string]any)
			for k, v := range props {
				if sub, ok := v.(map[string]any); ok {
					walk(sub, strings.TrimPrefix(path+"."+k, "."))
				}
			}
		case "string":
			out = append(out, path)
		}
	}
	walk(schema, "")
	slices.Sort(out)
	if len(out) < 20 {
		t.Fatalf("only %d string fields found in the schema", len(out))
	}
	return out
}

func setPath(m map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}
