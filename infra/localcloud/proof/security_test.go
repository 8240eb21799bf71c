package proof_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
)

// testNothingReachesAShell runs the entrypoint of every RayJob the suite
// created through bash, as Ray's job manager does (shell=True), with a
// python on PATH that records its argv: no injected command ran (the
// canary file does not exist), and each entrypoint started the trainer once
// (train.py, or datacheck.py for a data check's RayJob).
func testNothingReachesAShell(t *testing.T) {
	scenario := "shell: every RayJob entrypoint through bash"
	all := jobs.All()
	if len(all) < 10 {
		t.Fatalf("only %d RayJobs to check", len(all))
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	argv := filepath.Join(dir, "argv")
	script := "#!/bin/sh\nprintf '%s\\n' \"$@\" >> " + argv + "\necho --- >> " + argv + "\n"
	if err := os.WriteFile(filepath.Join(bin, "python"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(canary)
	for _, j := range all {
		_ = os.Remove(argv)
		cmd := exec.Command("bash", "-c", j.Entrypoint)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "HOME=" + dir}
		out, err := cmd.CombinedOutput()
		got, _ := os.ReadFile(argv)
		var problems []string
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: bash: %v %s", j.Name, err, out))
		}
		if strings.Count(string(got), "---\n") != 1 || (!strings.HasPrefix(string(got), manifests.ScriptPath+"\n") && !strings.HasPrefix(string(got), manifests.CheckPath+"\n")) {
			problems = append(problems, fmt.Sprintf("%s: the entrypoint did not run the trainer (training or its data check) once: %q", j.Name, got))
		}
		if _, err := os.Stat(canary); err == nil {
			problems = append(problems, fmt.Sprintf("%s: an injected command ran (entrypoint %q)", j.Name, j.Entrypoint))
			_ = os.Remove(canary)
		}
		report.Add(scenario, 0, 0, problems...)
		for _, p := range problems {
			t.Error(p)
		}
	}
}

// objectsOf reads every object of bucket whose name keep accepts.
func objectsOf(ctx context.Context, t *testing.T, bucket string, keep func(string) bool) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	it := st.GCS.Bucket(bucket).Objects(ctx, nil)
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if keep(a.Name) {
			out[a.Name] = readObject(t, st.GCS.Bucket(bucket).Object(a.Name))
		}
	}
}

// testSecrets searches everything the suite's runs left for the token
// planted in the Secret: every event, every object of the intake bucket
// (run records, leases, claims), the runs' evidence folders (their pods'
// logs, statuses and events), every log and state file of the local
// cloud, and every object the API server holds for the runs (Secrets
// aside). Each source must be non-empty and must hold the runs' IDs, so the
// search would have found the token had it been there.
func testSecrets(t *testing.T) {
	ctx := context.Background()
	scenario := "secrets: planted HF token never leaks"
	// A spec carrying the planted token itself must be rejected without
	// repeating it.
	runID := upload(t, "planted-token", spec(t, "planted", map[string]any{"model": map[string]any{"id": token}}), "")
	// The intake events of the scenarios before may still queue ahead of it
	// (the emulator pushes two at a time).
	if _, err := probe.WaitPhase(ctx, st, runID, 3*time.Minute, runs.Rejected); err != nil {
		t.Error(err)
	}
	if _, err := evs.WaitTerminal(runID, time.Minute, 0); err != nil {
		t.Error(err)
	}
	probeID := "crash-provision-1" // a run every source must mention
	search := func(source string, blobs map[string][]byte) {
		var problems []string
		mentioned := false
		for name, b := range blobs {
			if contains(b, token) {
				problems = append(problems, fmt.Sprintf("the token is in %s %s", source, name))
			}
			mentioned = mentioned || contains(b, probeID)
		}
		if !mentioned {
			problems = append(problems, fmt.Sprintf("%s (%d items) never mention run %s: the search looked in the wrong place", source, len(blobs), probeID))
		}
		report.Add(scenario, 0, 0, problems...)
		report.Note(scenario, fmt.Sprintf("%s: %d items searched", source, len(blobs)))
		for _, p := range problems {
			t.Error(p)
		}
	}

	ev := map[string][]byte{}
	for i, b := range evs.Raw() {
		ev[fmt.Sprint(i)] = b
	}
	search("events", ev)

	objs := map[string][]byte{}
	for _, bucket := range []string{stack.IntakeBucket, stack.StateBucket} {
		for name, b := range objectsOf(ctx, t, bucket, func(name string) bool {
			return bucket != stack.IntakeBucket || !strings.HasPrefix(name, "jobs/") // not what users uploaded, the planted spec among them
		}) {
			objs[bucket+"/"+name] = b
		}
	}
	search("intake and state bucket objects (records, leases, claims, cancellations)", objs)

	// The evidence finalize kept of the runs' pods: logs (ungzipped),
	// statuses, events, manifests.
	kept := objectsOf(ctx, t, output, func(name string) bool { return strings.Contains(name, "/evidence/") })
	for name, b := range kept {
		if !strings.HasSuffix(name, ".gz") {
			continue
		}
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if kept[name], err = io.ReadAll(zr); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	search("evidence folders (pod logs, statuses, events)", kept)

	logs := map[string][]byte{}
	if err := filepath.WalkDir(st.StateDir(), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || filepath.Base(path) == "functions" {
			return nil // the folder itself, and the functions' binary
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		logs[strings.TrimPrefix(path, st.StateDir())] = b
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	search("logs and state files", logs)

	objects := map[string][]byte{}
	add := func(kind, name string, obj any) {
		b, _ := yaml.Marshal(obj)
		objects[kind+"/"+name] = b
	}
	rjs, err := ray.RayV1().RayJobs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range rjs.Items {
		add("rayjob", j.Name, j)
	}
	rcs, err := ray.RayV1().RayClusters("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rcs.Items {
		add("raycluster", c.Name, c)
	}
	cms, err := kube.CoreV1().ConfigMaps("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cms.Items {
		add("configmap", c.Name, c)
	}
	search("Kubernetes objects", objects)
}

func readObject(t *testing.T, o *storage.ObjectHandle) []byte {
	r, err := o.NewReader(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close() }()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
