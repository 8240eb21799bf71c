package kubesim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/pkg/manifests"
)

// The data check runs for real.
//
// A RayJob whose entrypoint runs datacheck.py is not played: the local
// cloud runs trainer/datacheck.py itself, as the Ray head's driver would,
// from the code the run's cluster mounts at /code/ (the trainer
// ConfigMap the pipeline created), with the trainer's Python
// (Options.Python: the virtualenv of the trainer's tests), the RayJob's
// runtime env variables, the local Hub as HF_ENDPOINT and the local Cloud
// Storage as STORAGE_EMULATOR_HOST. What differs from GKE is where it
// runs: a process on this machine instead of the head pod, with the
// machine's cores, and no Hub token. The driver's output is the job's
// (the submitter's log, the dashboard), its exit code the job's status.

// checkScript is the data check's script, as the entrypoint names it.
var checkScript = filepath.Base(manifests.CheckPath)

// check runs the data check's Ray job.
func (p *play) check(ctx context.Context, rj *rayv1.RayJob, cluster string) {
	log := p.log()
	o := p.d.sim.o
	if o.Python == "" {
		p.say("raydrop: the local cloud runs the data check with the trainer's Python, and none was given: build it with `make trainer-venv` (or set RAYDROP_TRAINER_PYTHON)")
		p.end(rayv1.JobStatusFailed, "no Python to run "+checkScript+" with", msgFailed)
		return
	}
	dir, err := os.MkdirTemp("", "raydrop-check-")
	if err != nil {
		p.end(rayv1.JobStatusFailed, err.Error(), msgFailed)
		return
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := p.mountCode(ctx, rj.Namespace, cluster, filepath.Join(dir, "code")); err != nil {
		log.Warn("data check: no code to run", "err", err)
		p.say("raydrop: " + err.Error())
		p.end(rayv1.JobStatusFailed, err.Error(), msgFailed)
		return
	}
	words, _ := splitWords(rj.Spec.Entrypoint) // parsed before, by parseEntrypoint
	i := slices.IndexFunc(words, func(w string) bool { return strings.HasSuffix(w, "/"+checkScript) })
	cmd := exec.Command(o.Python, append([]string{filepath.Join(dir, "code", checkScript)}, words[i+1:]...)...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the check's pool of processes goes with it
	cmd.Env = append(checkEnv(rj.Spec.RuntimeEnvYAML), "HOME="+dir, "HF_HOME="+filepath.Join(dir, "hf"),
		"HF_ENDPOINT="+o.Hub, "STORAGE_EMULATOR_HOST="+o.StorageHost)
	out, err := cmd.StdoutPipe()
	if err != nil {
		p.end(rayv1.JobStatusFailed, err.Error(), msgFailed)
		return
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		p.end(rayv1.JobStatusFailed, err.Error(), msgFailed)
		return
	}
	var stopped bool
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		select {
		case <-p.stopCh:
			mu.Lock()
			stopped = true
			mu.Unlock()
		case <-ctx.Done():
		case <-done:
			return
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}()
	last := p.relay(out)
	err = cmd.Wait()
	close(done)
	mu.Lock()
	defer mu.Unlock()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return // the simulator stopped
	case stopped:
		p.end(rayv1.JobStatusStopped, "", "")
	case err == nil:
		log.Info("data check passed")
		p.end(rayv1.JobStatusSucceeded, "", "")
	case errors.As(err, &exit):
		log.Info("data check failed", "exitCode", exit.ExitCode(), "last", last)
		p.end(rayv1.JobStatusFailed, last, fmt.Sprintf("Job entrypoint command failed with exit code %d", exit.ExitCode()))
	default:
		p.end(rayv1.JobStatusFailed, err.Error(), msgFailed)
	}
}

// relay copies the driver's output into the job's, a line at a time, and
// returns its last line. A line saying the driver staged the base model
// marks the job as one that copied it from the Hub.
func (p *play) relay(r io.Reader) string {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var last string
	for sc.Scan() {
		line := sc.Text()
		p.say(line)
		if strings.HasPrefix(line, "raydrop: model: staged ") {
			p.update(func(r *JobRecord) { r.StagedModel = true })
		}
		if strings.TrimSpace(line) != "" {
			last = line
		}
	}
	_, _ = io.Copy(io.Discard, r)
	return last
}

// mountCode writes the files of the ConfigMap the cluster's head mounts at
// /code/ into dir, as the kubelet projects it.
func (p *play) mountCode(ctx context.Context, ns, cluster, dir string) error {
	c := p.d.sim.Client
	rc := &rayv1.RayCluster{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: cluster}, rc); err != nil {
		return fmt.Errorf("the data check's cluster %s/%s: %w", ns, cluster, err)
	}
	pod := rc.Spec.HeadGroupSpec.Template.Spec
	var volume string
	for _, ctr := range pod.Containers {
		for _, m := range ctr.VolumeMounts {
			if strings.TrimSuffix(m.MountPath, "/") == strings.TrimSuffix(manifests.CodeMountPath, "/") {
				volume = m.Name
			}
		}
	}
	var cmName string
	for _, v := range pod.Volumes {
		if v.Name == volume && v.ConfigMap != nil {
			cmName = v.ConfigMap.Name
		}
	}
	if cmName == "" {
		return fmt.Errorf("the head of %s/%s mounts no ConfigMap at %s", ns, cluster, manifests.CodeMountPath)
	}
	cm := &corev1.ConfigMap{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: cmName}, cm); err != nil {
		return fmt.Errorf("the trainer code of %s/%s: %w", ns, cluster, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for name, text := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(name)), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// checkEnv is the driver's environment: the machine's PATH, the RayJob's
// runtime env variables, and what keeps a CPU process of the trainer's
// libraries quiet and small.
func checkEnv(runtimeEnvYAML string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1", "TOKENIZERS_PARALLELISM=false",
		"OMP_NUM_THREADS=1", "HF_HUB_DISABLE_TELEMETRY=1", "HF_HUB_DISABLE_PROGRESS_BARS=1", "HF_DATASETS_DISABLE_PROGRESS_BARS=1"}
	var re struct {
		EnvVars map[string]string `json:"env_vars"`
	}
	_ = yaml.Unmarshal([]byte(runtimeEnvYAML), &re)
	for k, v := range re.EnvVars {
		env = append(env, k+"="+v)
	}
	return env
}
