package kubesim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// play is one submitted Ray job: its dashboard status and the trainer
// stand-in that writes its storage layout.
type play struct {
	d          *dashboard
	id         string
	rayJobID   string // Ray's own job ID (the driver's), as the dashboard reports it
	rayJob     types.NamespacedName
	job        types.UID // the submitter Job that submitted it
	entrypoint string

	stopOnce sync.Once
	stopCh   chan struct{}

	mu      sync.Mutex
	rec     JobRecord
	failMsg string
	// out is the driver's output so far, a line each: what `ray job
	// submit` tails into the submitter pod's log.
	out []string
}

var rayJobSeq struct {
	sync.Mutex
	n int
}

func newPlay(d *dashboard, job *batchv1.Job, id string) *play {
	rayJobSeq.Lock()
	rayJobSeq.n++
	n := rayJobSeq.n
	rayJobSeq.Unlock()
	p := &play{d: d, id: id, rayJobID: fmt.Sprintf("%02x000000", n+1), job: job.UID, stopCh: make(chan struct{})}
	if owner := metav1.GetControllerOf(job); owner != nil && owner.Kind == "RayJob" {
		p.rayJob = types.NamespacedName{Namespace: job.Namespace, Name: owner.Name}
	}
	p.rec = JobRecord{
		SubmissionID: id,
		RayJob:       p.rayJob.String(),
		Status:       rayv1.JobStatusPending,
		Submitted:    time.Now(),
		Args:         map[string]string{},
		Checkpoints:  []string{},
	}
	return p
}

func (p *play) snapshot() JobRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rec
	r.Checkpoints = append([]string{}, p.rec.Checkpoints...)
	r.Args = make(map[string]string, len(p.rec.Args))
	for k, v := range p.rec.Args {
		r.Args[k] = v
	}
	return r
}

func (p *play) update(f func(r *JobRecord)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(&p.rec)
}

// say adds a line to the driver's output.
func (p *play) say(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.out = append(p.out, line)
}

// outputFrom is the driver's output from line n on.
func (p *play) outputFrom(n int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n >= len(p.out) {
		return nil
	}
	return slices.Clone(p.out[n:])
}

func (p *play) failMessage() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failMsg != "" {
		return p.failMsg
	}
	return msgFailed
}

// stopJob is `ray job stop`: a pending or running job ends STOPPED.
func (p *play) stopJob() {
	p.update(func(r *JobRecord) { r.StopCalls++ })
	p.stopOnce.Do(func() { close(p.stopCh) })
}

// end sets a terminal status.
func (p *play) end(st rayv1.JobStatus, errText, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rec.Status = st
	p.rec.Error = errText
	p.rec.Ended = time.Now()
	if msg != "" {
		p.failMsg = msg
	}
}

var errStopped = errors.New("stopped")

// sleep waits d, or returns errStopped once the job is stopped, or the
// context's error.
func (p *play) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-p.stopCh:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *play) log() *slog.Logger {
	return p.d.sim.log.With("submissionId", p.id, "rayJob", p.rayJob.String())
}

// run plays the job to its end.
func (p *play) run(ctx context.Context) {
	log := p.log()
	s := p.d.sim
	rj := &rayv1.RayJob{}
	if err := s.Client.Get(ctx, p.rayJob, rj); err != nil {
		if ctx.Err() != nil {
			return
		}
		log.Warn("Ray job submitted without a RayJob to read", "err", err)
		p.end(rayv1.JobStatusFailed, "", msgBadFlags)
		return
	}
	p.entrypoint = rj.Spec.Entrypoint
	cluster := rj.Status.RayClusterName
	if cluster == "" {
		cluster = rj.Spec.ClusterSelector[utils.RayJobClusterSelectorKey]
	}
	sc := DefaultScenario()
	if s.o.Scenario != nil {
		sc = s.o.Scenario(ctx, rj.DeepCopy())
	}
	sc = sc.withDefaults()
	args, argErr := parseEntrypoint(rj.Spec.Entrypoint)
	p.update(func(r *JobRecord) {
		r.Cluster, r.Scenario, r.Evidence = cluster, sc, evidenceOf(rj)
		if args != nil {
			for k, v := range args.all {
				r.Args[k] = v
			}
		}
	})
	log.Info("Ray job submitted", "scenario", sc.Outcome, "at", sc.At)

	switch err := p.sleep(ctx, sc.PendingFor); {
	case errors.Is(err, errStopped):
		p.end(rayv1.JobStatusStopped, "", "")
		return
	case err != nil:
		return
	}
	p.update(func(r *JobRecord) { r.Status, r.Started = rayv1.JobStatusRunning, time.Now() })
	if argErr != nil {
		log.Info("trainer rejected its flags", "err", argErr)
		p.end(rayv1.JobStatusFailed, "usage error: "+argErr.Error(), msgBadFlags)
		return
	}

	if args.check {
		p.check(ctx, rj, cluster)
		return
	}
	t := &trainer{p: p, a: args, sc: sc, st: newStore(s.o.Storage, s.o.Project), cluster: cluster, ns: rj.Namespace}
	switch err := t.waitForWorkers(ctx); {
	case errors.Is(err, errStopped):
		p.end(rayv1.JobStatusStopped, "", "")
		return
	case err != nil:
		return
	}
	t.ranksStarted(ctx)
	outcome, errText := t.train(ctx)
	switch outcome {
	case "":
		return // the simulator stopped
	case rayv1.JobStatusSucceeded:
		p.end(rayv1.JobStatusSucceeded, "", "")
	case rayv1.JobStatusFailed:
		p.end(rayv1.JobStatusFailed, errText, "")
	case rayv1.JobStatusStopped:
		p.end(rayv1.JobStatusStopped, "", "")
	case JobStatusLost:
		p.end(JobStatusLost, "", "")
	}
	r := p.snapshot()
	log.Info("Ray job ended", "status", r.Status, "lastStep", r.LastStep, "checkpoints", len(r.Checkpoints), "err", r.Error)
}

// trainer writes what the real trainer and Ray Train V1 write.
type trainer struct {
	p       *play
	a       *trainerArgs
	sc      Scenario
	st      *store
	cluster string
	ns      string

	trial    string // trial folder object name
	trialID  string
	date     string
	started  time.Time
	rows     []map[string]any
	history  []map[string]any // trainer_state log_history, resumed history first
	ckpts    []string         // checkpoint dir names of this trial
	latest   any              // latest checkpoint dir name or nil
	resumed  int
	lossSum  float64
	lossN    int
	lastIter time.Time
	data     map[string]any // the length filter's counts, in every report
	evalRows int            // rows every checkpoint is evaluated on
	samples  any            // the mark's samples entry, once written
	notice   bool           // a preemption notice came: save at this step
	// startup is the trainer's account of its start (checkpoints.
	// TrainerStartup) until the first report after the first step sends it.
	startup map[string]any
	// stageSeconds is how long the driver staged the model (or waited).
	stageSeconds float64
	// driverLog is the driver's output so far (driverlog.go).
	driverLog strings.Builder
	// head is the head pod, where the driver runs (found at its first line).
	head *corev1.Pod
	// heart plays the ranks' heartbeats once the train function began.
	heart *heart
}

// train runs the steps and returns the Ray job's terminal status, "" if the
// simulator stopped first, and the application error of a failed run.
func (t *trainer) train(ctx context.Context) (status rayv1.JobStatus, errText string) {
	a, sc := t.a, t.sc
	exp := a.experimentName()
	now := time.Now().UTC()
	t.started, t.lastIter = now, now
	t.date = now.Format("2006-01-02_15-04-05")
	t.trialID = fmt.Sprintf("%05x_00000", rand.IntN(1<<20))
	t.trial = joinName(exp, fmt.Sprintf("TorchTrainer_%s_0_%s", t.trialID, t.date))
	t.latest = nil
	t.logf("raydrop: run %s: %d workers, storage %s/%s", a.runID, a.numWorkers, a.storagePath, exp)
	t.p.update(func(r *JobRecord) {
		r.Experiment = gsURI(a.bucket, exp)
		r.Trial = gsURI(a.bucket, t.trial)
	})

	// The driver stages the base model (or waits for it) before Ray Train
	// starts.
	// A failure writes no mark when it may pass (the Hub, the bucket), as
	// train.py: the pipeline retries the attempt; a snapshot with no weights
	// gets a failed mark.
	staging := time.Now()
	if err := t.stageModel(ctx); errors.Is(err, errStopped) {
		return rayv1.JobStatusStopped, ""
	} else if err != nil && strings.HasPrefix(err.Error(), "ValueError: ") {
		return t.abort(ctx, err.Error(), false)
	} else if err != nil {
		t.logf("raydrop: could not stage the model at %s: %v; no completion mark, so the pipeline retries the attempt", t.a.all["staged-model"], err)
		return rayv1.JobStatusFailed, err.Error()
	}
	t.stageSeconds = time.Since(staging).Seconds()
	// Ray Train validates the storage path, then writes the experiment and
	// trial metadata.
	if err := t.st.ensureBucket(ctx, a.bucket); err != nil {
		return t.abort(ctx, fmt.Sprintf("OSError: storage %s is not writable: %v", a.storagePath, err), false)
	}
	if err := t.writeStart(ctx); err != nil {
		return t.abort(ctx, fmt.Sprintf("OSError: write to %s: %v", a.storagePath, err), false)
	}

	// Resume: the checkpoint's trainer_state.json says where training stands.
	if a.resumeFrom != "" {
		step, hist, err := t.readResume(ctx)
		if err != nil {
			return t.abort(ctx, err.Error(), true)
		}
		t.resumed, t.history = step, hist
		t.p.update(func(r *JobRecord) { r.ResumedFrom = step })
	}

	// The train function begins once Ray's runtime env is set up; it
	// starts the ranks' heartbeats, then gets the base model and the data,
	// timing both, as trainer/worker.py does.
	defer func() {
		t.heart.end(ctx, status != "" && status != rayv1.JobStatusStopped && status != JobStatusLost)
	}()
	if err := t.startFunction(ctx); errors.Is(err, errStopped) {
		return rayv1.JobStatusStopped, ""
	} else if err != nil {
		return "", ""
	}

	// The length filter and the held-out rows, as trainer/worker.py makes
	// them before training: the simulated dataset holds one epoch's
	// samples, the rows held out from it (--eval-share of what fits, at
	// least one) and the scenario's over-long rows, the longest of them 64
	// tokens over the limit. An --eval-split is another split of 1 % of it.
	train := sc.StepsPerEpoch * a.numWorkers * a.batchSize * a.gradAccum
	evalRows := 0
	switch {
	case a.evalSplit != "":
		evalRows = max(1, train/100)
	case a.evalShare > 0:
		evalRows = max(1, int(math.Round(float64(train)*a.evalShare/(1-a.evalShare))))
	}
	rows := train + sc.DroppedRows
	if a.evalSplit == "" {
		rows += evalRows
	}
	t.evalRows = evalRows
	t.workerf("dataset: %d rows, %d left out as longer than %d tokens (longest %d)", rows, sc.DroppedRows, a.maxSeqLength, a.maxSeqLength+64)
	t.data = map[string]any{"dataset_rows": rows, "dropped_rows": sc.DroppedRows, "max_seq_length": a.maxSeqLength, "eval_rows": evalRows}
	if float64(sc.DroppedRows)/float64(rows) > a.maxDroppedShare {
		return t.fail(ctx, fmt.Sprintf("ValueError: %d of %d rows (%.1f %%) are longer than --max-seq-length %d tokens "+
			"(image block included; the longest has %d), more than --max-dropped-share %g allows: "+
			"raise training.maxSeqLength or training.maxDroppedShare",
			sc.DroppedRows, rows, 100*float64(sc.DroppedRows)/float64(rows), a.maxSeqLength, a.maxSeqLength+64, a.maxDroppedShare), t.resumed)
	}

	total := a.maxSteps
	if total <= 0 {
		total = a.epochs * sc.StepsPerEpoch
	}
	t.p.update(func(r *JobRecord) { r.TotalSteps, r.LastStep = total, t.resumed })
	at := -1
	if sc.Outcome != Succeed {
		at = min(max(sc.At, t.resumed+1), max(total, t.resumed+1))
	}

	for step := t.resumed + 1; step <= total || step == at; step++ {
		if step == at {
			switch sc.Outcome {
			case Fail:
				msg := sc.Error
				if msg == "" {
					msg = fmt.Sprintf("RuntimeError: simulated training failure at step %d", step)
				}
				// The rank that raised prints its traceback on its stderr.
				t.rankOut(ctx, t.failingRank(), "err", traceback(msg)...)
				return t.fail(ctx, msg, step)
			case LoseHead:
				return t.loseHead(ctx, step)
			case Preempt:
				return t.preempted(ctx, step, total)
			case Reclaim, ReclaimInSave:
				return t.reclaimed(ctx, step, total, sc.Outcome == ReclaimInSave)
			case CudaOOM, NcclTimeout, HostOOM, OOMKilled:
				return t.rankFailure(ctx, step)
			case Hang:
				t.p.log().Info("Ray job hangs", "step", step)
				select {
				case <-t.p.stopCh:
					return rayv1.JobStatusStopped, ""
				case <-ctx.Done():
					return "", ""
				}
			}
		}
		switch err := t.p.sleep(ctx, sc.StepTime); {
		case errors.Is(err, errStopped):
			return rayv1.JobStatusStopped, ""
		case err != nil:
			return "", ""
		}
		if err := t.step(ctx, step, total); err != nil {
			if ctx.Err() != nil {
				return "", ""
			}
			return t.fail(ctx, fmt.Sprintf("OSError: %v", err), step)
		}
	}
	if err := t.finish(ctx, total); err != nil {
		if ctx.Err() != nil {
			return "", ""
		}
		return t.fail(ctx, fmt.Sprintf("OSError: %v", err), total)
	}
	if err := t.writeSamples(ctx); err != nil {
		if ctx.Err() != nil {
			return "", ""
		}
		return t.fail(ctx, fmt.Sprintf("OSError: write sample answers: %v", err), total)
	}
	if err := t.writeMark(ctx, "succeeded", nil); err != nil {
		if ctx.Err() != nil {
			return "", ""
		}
		return rayv1.JobStatusFailed, fmt.Sprintf("OSError: write completion mark: %v", err)
	}
	return rayv1.JobStatusSucceeded, ""
}

// abort ends a run that failed before training: the mark is still written.
func (t *trainer) abort(ctx context.Context, errText string, trialWritten bool) (rayv1.JobStatus, string) {
	if ctx.Err() != nil {
		return "", ""
	}
	if trialWritten {
		_ = t.st.put(ctx, t.a.bucket, t.trial+"/error.txt", []byte(t.errorTxt(errText)))
	} else {
		t.trial = ""
	}
	_ = t.writeMark(ctx, "failed", errText)
	return rayv1.JobStatusFailed, errText
}

func (t *trainer) fail(ctx context.Context, errText string, step int) (rayv1.JobStatus, string) {
	if ctx.Err() != nil {
		return "", ""
	}
	t.p.log().Info("Ray job fails", "step", step, "err", errText)
	// Ray Tune's controller logs the trial's failure on the driver with the
	// worker's traceback (ray/tune/execution/tune_controller.py,
	// _process_trial_failure), then the driver raises TrainingFailedError.
	_, body, _ := strings.Cut(t.errorTxt(errText), "\n")
	t.logf("%s\tERROR tune_controller.py:1331 -- Trial task failed for trial TorchTrainer_%s\nTraceback (most recent call last):\n%s", rayTime(time.Now()), t.trialID, strings.TrimSuffix(body, "\n"))
	_ = t.st.put(ctx, t.a.bucket, t.trial+"/error.txt", []byte(t.errorTxt(errText)))
	_ = t.writeExperimentState(ctx, "ERROR")
	if err := t.writeMark(ctx, "failed", errText); err != nil && ctx.Err() != nil {
		return "", ""
	}
	return rayv1.JobStatusFailed, errText
}

// loseHead deletes the RayCluster's head Pod, as a lost node would. The
// job dies with its head and leaves no completion mark.
func (t *trainer) loseHead(ctx context.Context, step int) (rayv1.JobStatus, string) {
	s := t.p.d.sim
	pods, err := s.clusterPods(ctx, t.ns, t.cluster, rayv1.HeadNode)
	if err != nil && ctx.Err() != nil {
		return "", ""
	}
	var names []string
	for i := range pods {
		pod := &pods[i]
		if err := s.Client.Delete(ctx, pod); err == nil {
			names = append(names, pod.Name)
		}
	}
	t.p.update(func(r *JobRecord) { r.HeadPod = strings.Join(names, ",") })
	t.p.log().Info("Ray head lost", "step", step, "cluster", t.cluster, "headPod", names)
	return JobStatusLost, ""
}

// preempted plays a node reclaimed during step: the worker's pod gets its
// notice, the trainer finishes the step and saves a checkpoint of it, then
// writes a preempted mark and stops, as trainer/train.py does on a notice.
func (t *trainer) preempted(ctx context.Context, step, total int) (rayv1.JobStatus, string) {
	pod, err := t.p.d.sim.preempt(ctx, t.ns, t.cluster)
	if err != nil {
		if ctx.Err() != nil {
			return "", ""
		}
		t.p.log().Warn("no worker to preempt", "err", err)
	}
	t.p.log().Info("worker node reclaimed", "step", step, "pod", pod)
	t.notice = true
	if err := t.step(ctx, step, total); err != nil {
		return t.fail(ctx, fmt.Sprintf("OSError: %v", err), step)
	}
	msg := fmt.Sprintf("raydrop: preemption notice during step %d: saved checkpoint %v and stopped", step, t.latest)
	t.logf("%s", msg)
	if err := t.copyLog(ctx); err != nil && ctx.Err() != nil {
		return "", ""
	}
	if err := t.writeMark(ctx, "preempted", msg); err != nil && ctx.Err() != nil {
		return "", ""
	}
	return rayv1.JobStatusFailed, msg
}

// reclaimed plays a node reclaimed during step before the save on notice
// could end (Reclaim, ReclaimInSave): the worker's pod fails, KubeRay
// deletes it, and only then does the driver learn that the worker died
// (Ray notices a node gone by its missed health checks, seconds later) and
// write a failed mark. In a save, the checkpoint folder of the step is
// left without its adapter.
func (t *trainer) reclaimed(ctx context.Context, step, total int, inSave bool) (rayv1.JobStatus, string) {
	s := t.p.d.sim
	pod, err := s.preempt(ctx, t.ns, t.cluster)
	if err != nil {
		if ctx.Err() != nil {
			return "", ""
		}
		t.p.log().Warn("no worker to reclaim", "err", err)
	}
	t.p.log().Info("worker node reclaimed", "step", step, "pod", pod, "in_save", inSave)
	if inSave {
		// The worker saw the notice at the step's end and told the driver
		// (trainer/notice.py Watch._tell); the upload of the step's
		// checkpoint had begun.
		t.notice = true
		name := fmt.Sprintf("checkpoint_%06d", len(t.ckpts))
		if err := t.st.put(ctx, t.a.bucket, t.trial+"/"+name+"/checkpoint/adapter_config.json", []byte("{}")); err != nil && ctx.Err() != nil {
			return "", ""
		}
	}
	if pod != "" {
		if err := s.waitDeleted(ctx, t.ns, pod); err != nil {
			if ctx.Err() != nil {
				return "", ""
			}
			t.p.log().Warn("the reclaimed pod was not deleted", "pod", pod, "err", err)
		}
	}
	msg := "WorkerGroupError: Training failed due to worker errors: ray.exceptions.ActorDiedError: " +
		"The actor died unexpectedly before finishing this task (the node running it was lost)"
	return t.fail(ctx, msg, step)
}

// curve is how the simulated losses fall for the job's hyper-parameters,
// so that a sweep's trials differ as real ones would and its ranking and
// early stopping have something to act on: the loss falls towards a floor
// that rises as the learning rate moves away from 2e-4 (on a log scale)
// and the LoRA rank from 16, a higher learning rate falls faster, and the
// seed adds a small, fixed offset. The spec's defaults (2e-4, rank 16,
// seed 42) give the curve the local cloud has always played.
type curve struct{ floor, scale, offset float64 }

func (t *trainer) curve() curve {
	a := t.a
	lr, r := a.learningRate, float64(max(a.loraR, 1))
	if lr <= 0 {
		lr = 2e-4
	}
	dl, dr := math.Log10(lr/2e-4), math.Log2(r/16)
	return curve{
		floor:  0.25*dl*dl + 0.04*dr*dr,
		scale:  math.Pow(2e-4/lr, 0.3),
		offset: 0.01 * math.Sin(float64(a.seed-42)*1.7),
	}
}

// loss is the training loss at step; evalLoss the held-out loss, a little
// above it.
func (c curve) loss(step int) float64 {
	return round(0.35+c.floor+c.offset+2.4*math.Exp(-float64(step)/(12*c.scale)), 4)
}

func (c curve) evalLoss(step int) float64 {
	return round(0.45+c.floor+c.offset+2.2*math.Exp(-float64(step)/(10*c.scale)), 4)
}

// metrics of one optimizer step: the loss falls with the global step.
func (t *trainer) metrics(step, total int) map[string]any {
	a := t.a
	perStep := float64(a.numWorkers * a.batchSize * a.gradAccum)
	done := float64(step - t.resumed)
	lr := a.learningRate
	if warm := int(math.Ceil(a.warmupRatio * float64(total))); warm > 0 && step < warm {
		lr = a.learningRate * float64(step) / float64(warm)
	}
	m := map[string]any{
		"loss":                t.curve().loss(step),
		"grad_norm":           0.4 + 2.0*math.Exp(-float64(step)/8),
		"learning_rate":       lr,
		"num_tokens":          done * perStep * 413,
		"num_loss_tokens":     done * perStep * 40,
		"mean_token_accuracy": 0.9 - 0.5*math.Exp(-float64(step)/10),
		"epoch":               round(float64(step)/float64(t.sc.StepsPerEpoch), 4),
		"step":                step,
	}
	maps.Copy(m, t.data)
	return m
}

func (t *trainer) saves(step, total int) bool {
	if step == total || t.notice {
		return true
	}
	if t.a.saveStrategy == "steps" {
		return step%t.a.saveSteps == 0
	}
	return step%t.sc.StepsPerEpoch == 0
}

// startFunction plays the time before the train function begins (the
// scenario's Env), then its getting the model and the data (Weights,
// Data), and keeps its account for the first report.
func (t *trainer) startFunction(ctx context.Context) error {
	sc := t.sc
	if err := t.p.sleep(ctx, sc.Env); err != nil {
		return err
	}
	t.heart = t.startHeart(ctx)
	began := time.Now()
	if err := t.p.sleep(ctx, sc.Weights); err != nil {
		return err
	}
	weights := time.Since(began)
	if err := t.p.sleep(ctx, sc.Data); err != nil {
		return err
	}
	data := time.Since(began) - weights
	t.startup = map[string]any{"started_at": unixSeconds(began), "weights_s": round(weights.Seconds(), 3), "data_s": round(data.Seconds(), 3),
		"stage_s": round(t.stageSeconds, 3)}
	return nil
}

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// rayKeys adds what Ray Tune adds to every reported result.
func (t *trainer) rayKeys(m map[string]any, ckpt any) {
	now := time.Now()
	m["timestamp"] = now.Unix()
	m["checkpoint_dir_name"] = ckpt
	m["done"] = false
	m["training_iteration"] = len(t.rows) + 1
	m["trial_id"] = t.trialID
	m["date"] = now.UTC().Format("2006-01-02_15-04-05")
	m["time_this_iter_s"] = now.Sub(t.lastIter).Seconds()
	m["time_total_s"] = now.Sub(t.started).Seconds()
	m["time_since_restore"] = now.Sub(t.started).Seconds()
	m["iterations_since_restore"] = len(t.rows) + 1
	m["pid"] = 4242
	m["hostname"] = t.cluster + "-head"
	m["node_ip"] = "10.244.0.2"
	m["config"] = map[string]any{"train_loop_config": t.loopConfig()}
	if t.a.resumeFrom != "" {
		m["resumed_from_step"] = t.resumed
		m["resumed_optimizer_step"] = t.resumed
		m["resumed_scheduler_step"] = t.resumed
	}
	t.lastIter = now
}

// step reports one optimizer step; at a save, the checkpoint is persisted
// before the report that names it, as Ray Train does.
func (t *trainer) step(ctx context.Context, step, total int) error {
	m := t.metrics(step, total)
	logEntry := map[string]any{}
	for k, v := range m {
		logEntry[k] = v
	}
	t.history = append(t.history, logEntry)
	if l, ok := m["loss"].(float64); ok {
		t.lossSum += l
		t.lossN++
	}
	t.heart.step(step)
	var ckpt any
	if t.saves(step, total) {
		if t.evalRows > 0 {
			t.heart.note("evaluating")
		}
		t.heart.note("saving")
		name := fmt.Sprintf("checkpoint_%06d", len(t.ckpts))
		if err := t.writeCheckpoint(ctx, name, step, total); err != nil {
			return err
		}
		t.ckpts = append(t.ckpts, name)
		t.latest = name
		ckpt = name
		m["should_checkpoint"] = true
		if t.evalRows > 0 {
			// The evaluation the trainer runs on the held-out rows before it
			// reports a checkpoint: a loss a little above training's.
			m["eval_loss"] = t.curve().evalLoss(step)
			m["eval_tokens"] = float64(t.evalRows * 40)
			m["eval_runtime"] = 0.5
		}
		t.p.update(func(r *JobRecord) { r.Checkpoints = append(r.Checkpoints, gsURI(t.a.bucket, t.trial+"/"+name)) })
	}
	m["latest_checkpoint_dir_name"] = t.latest
	if t.startup != nil {
		t.startup["first_step_at"] = unixSeconds(time.Now())
		m[checkpoints.StartupKey] = t.startup
		t.startup = nil
	}
	t.rayKeys(m, ckpt)
	t.rows = append(t.rows, m)
	if err := t.writeResults(ctx); err != nil {
		return err
	}
	t.logStep(logEntry)
	if err := t.copyLog(ctx); err != nil {
		return err
	}
	t.p.update(func(r *JobRecord) { r.LastStep = step })
	return nil
}

// finish reports the end-of-training line.
func (t *trainer) finish(ctx context.Context, total int) error {
	last := map[string]any{}
	if n := len(t.history); n > 0 {
		for k, v := range t.history[n-1] {
			last[k] = v
		}
	} else {
		last = t.metrics(total, total)
	}
	runtime := time.Since(t.started).Seconds()
	steps := total - t.resumed
	if steps < 0 {
		steps = 0
	}
	perStep := float64(t.a.numWorkers * t.a.batchSize * t.a.gradAccum)
	tokens := float64(steps) * perStep * 413
	trainLoss := 0.0
	if t.lossN > 0 {
		trainLoss = t.lossSum / float64(t.lossN)
	}
	last["train_runtime"] = round(runtime, 4)
	last["train_samples_per_second"] = round(float64(steps)*perStep/runtime, 3)
	last["train_steps_per_second"] = round(float64(steps)/runtime, 3)
	last["train_loss"] = trainLoss
	last["train_tokens"] = tokens
	last["train_loss_tokens"] = float64(steps) * perStep * 40
	last["tokens_per_second"] = tokens / runtime
	last["train_steps"] = steps
	last["global_step"] = max(total, t.resumed)
	last["total_flos"] = 0.0
	last["latest_checkpoint_dir_name"] = t.latest
	t.rayKeys(last, nil)
	t.rows = append(t.rows, last)
	if err := t.writeResults(ctx); err != nil {
		return err
	}
	return t.writeExperimentState(ctx, "TERMINATED")
}

func round(f float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(f*p) / p
}

func gsURI(bucket, name string) string {
	if name == "" {
		return "gs://" + bucket
	}
	return "gs://" + bucket + "/" + name
}

func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}
