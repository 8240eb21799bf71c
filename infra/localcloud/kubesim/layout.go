package kubesim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// store writes objects through the Cloud Storage client; with no client it
// writes nothing.
type store struct {
	c       *storage.Client
	project string
}

func newStore(c *storage.Client, project string) *store { return &store{c: c, project: project} }

func (s *store) ensureBucket(ctx context.Context, bucket string) error {
	if s.c == nil {
		return nil
	}
	b := s.c.Bucket(bucket)
	if _, err := b.Attrs(ctx); err == nil {
		return nil
	} else if !errors.Is(err, storage.ErrBucketNotExist) {
		return err
	}
	err := b.Create(ctx, s.project, nil)
	var gerr *googleapi.Error
	if errors.As(err, &gerr) && gerr.Code == 409 {
		return nil // created meanwhile
	}
	return err
}

// put writes a whole object (objects are immutable: a rewrite replaces it).
func (s *store) put(ctx context.Context, bucket, name string, data []byte) error {
	if s.c == nil {
		return nil
	}
	w := s.c.Bucket(bucket).Object(name).NewWriter(ctx)
	w.ChunkSize = 0 // one request
	if strings.HasSuffix(name, ".json") {
		w.ContentType = "application/json"
	} else {
		w.ContentType = "application/octet-stream"
	}
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return fmt.Errorf("write gs://%s/%s: %w", bucket, name, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("write gs://%s/%s: %w", bucket, name, err)
	}
	return nil
}

func (s *store) get(ctx context.Context, bucket, name string) ([]byte, error) {
	if s.c == nil {
		return nil, errors.New("no Cloud Storage client")
	}
	r, err := s.c.Bucket(bucket).Object(name).NewReader(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Close() }()
	return io.ReadAll(io.LimitReader(r, 16<<20))
}

// loopConfig is the trainer's train_loop_config: every flag, typed.
func (t *trainer) loopConfig() map[string]any {
	cfg := map[string]any{"resume_from": nil}
	for k, v := range t.a.all {
		key := strings.ReplaceAll(k, "-", "_")
		switch {
		case v == "true" || v == "false":
			cfg[key] = v == "true"
		case k == "run-id" || k == "experiment-name" || k == "storage-path" || k == "resume-from":
			cfg[key] = v
		default:
			if n, err := strconv.Atoi(v); err == nil {
				cfg[key] = n
			} else if f, err := strconv.ParseFloat(v, 64); err == nil {
				cfg[key] = f
			} else {
				cfg[key] = v
			}
		}
	}
	cfg["run_id"] = t.a.runID
	cfg["experiment_name"] = t.a.experiment
	cfg["storage_path"] = t.a.storagePath
	return cfg
}

// writeStart writes what Ray Train writes before the first report.
func (t *trainer) writeStart(ctx context.Context) error {
	b, exp := t.a.bucket, t.a.experimentName()
	if err := t.st.put(ctx, b, exp+"/.validate_storage_marker", nil); err != nil {
		return err
	}
	if err := t.writeExperimentState(ctx, "RUNNING"); err != nil {
		return err
	}
	return t.st.put(ctx, b, t.trial+"/params.json", mustJSON(map[string]any{"train_loop_config": t.loopConfig()}))
}

// writeExperimentState writes Ray Tune's experiment snapshot (the parts
// a reader would look at).
func (t *trainer) writeExperimentState(ctx context.Context, status string) error {
	b, exp := t.a.bucket, t.a.experimentName()
	trialName := t.trial[strings.LastIndex(t.trial, "/")+1:]
	trial, _ := json.Marshal(map[string]any{
		"stub": false, "trainable_name": "TorchTrainer", "trial_id": t.trialID,
		"status": status, "relative_logdir": trialName,
		"config": map[string]any{"train_loop_config": t.loopConfig()},
	})
	runtime, _ := json.Marshal(map[string]any{"status": status, "num_failures": 0})
	state := map[string]any{
		"trial_data": [][]string{{string(trial), string(runtime)}},
		"runner_data": map[string]any{
			"_earliest_stopping_actor": nil, "_insufficient_resources_manager": nil,
			"_iteration": len(t.rows), "_session_str": t.date,
		},
		"stats": map[string]any{"start_time": float64(t.started.UnixNano()) / 1e9},
	}
	if err := t.st.put(ctx, b, exp+"/experiment_state-"+t.date+".json", mustJSON(state)); err != nil {
		return err
	}
	variant := map[string]any{"_uuid_prefix": t.trialID[:5] + "_", "_total_samples": 1, "_finished": status != "RUNNING"}
	return t.st.put(ctx, b, exp+"/basic-variant-state-"+t.date+".json", mustJSON(variant))
}

// writeResults rewrites the trial's result.json: one JSON line per report.
func (t *trainer) writeResults(ctx context.Context) error {
	var buf bytes.Buffer
	for _, r := range t.rows {
		line, err := json.Marshal(r)
		if err != nil {
			return err
		}
		buf.Write(line)
		buf.WriteByte('\n')
	}
	return t.st.put(ctx, t.a.bucket, t.trial+"/result.json", buf.Bytes())
}

// safetensors is a valid, empty safetensors file: a little-endian header
// length, then the JSON header.
func safetensors() []byte {
	header := []byte(`{"__metadata__":{"format":"pt"}}`)
	out := make([]byte, 8, 8+len(header))
	binary.LittleEndian.PutUint64(out, uint64(len(header)))
	return append(out, header...)
}

// writeCheckpoint persists checkpoint_00000N/checkpoint/: the adapter, its
// config and the trainer state.
func (t *trainer) writeCheckpoint(ctx context.Context, name string, step, total int) error {
	a := t.a
	dir := t.trial + "/" + name + "/checkpoint/"
	targets := []string{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
	if a.targetModules != "all-linear" {
		targets = strings.Split(a.targetModules, ",")
	}
	exclude := any(".*vision_tower.*")
	if a.visionTower {
		exclude = nil
	}
	adapterConfig := map[string]any{
		"base_model_name_or_path": a.modelID, "peft_type": "LORA", "task_type": "CAUSAL_LM",
		"r": a.loraR, "lora_alpha": a.loraAlpha, "lora_dropout": a.loraDropout,
		"target_modules": targets, "exclude_modules": exclude, "bias": "none",
		"inference_mode": true, "modules_to_save": nil, "use_dora": false, "use_rslora": false,
	}
	epochs := a.epochs
	if a.maxSteps > 0 {
		epochs = (a.maxSteps + t.sc.StepsPerEpoch - 1) / t.sc.StepsPerEpoch
	}
	state := map[string]any{
		"global_step":           step,
		"epoch":                 round(float64(step)/float64(t.sc.StepsPerEpoch), 4),
		"log_history":           t.history,
		"max_steps":             total,
		"num_train_epochs":      epochs,
		"logging_steps":         a.loggingSteps,
		"save_steps":            a.saveSteps,
		"eval_steps":            500,
		"train_batch_size":      a.batchSize,
		"num_input_tokens_seen": 0,
		"total_flos":            0.0,
		"best_metric":           nil,
		"best_global_step":      nil,
		"best_model_checkpoint": nil,
		"is_hyper_param_search": false,
		"is_local_process_zero": true,
		"is_world_process_zero": true,
		"trial_name":            nil,
		"trial_params":          nil,
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"adapter_model.safetensors", safetensors()},
		{"adapter_config.json", mustJSON(adapterConfig)},
		{"trainer_state.json", mustJSON(state)},
	} {
		if err := t.st.put(ctx, a.bucket, dir+f.name, f.data); err != nil {
			return err
		}
	}
	return nil
}

// readResume reads the global step and log history of --resume-from (a
// checkpoint_00000N folder or its checkpoint/ child).
func (t *trainer) readResume(ctx context.Context) (int, []map[string]any, error) {
	bucket, name, _ := splitGS(t.a.resumeFrom)
	if !strings.HasSuffix(name, "/checkpoint") {
		name += "/checkpoint"
	}
	b, err := t.st.get(ctx, bucket, name+"/trainer_state.json")
	if err != nil {
		return 0, nil, fmt.Errorf("FileNotFoundError: no trainer_state.json in %s: %w", t.a.resumeFrom, err)
	}
	var st struct {
		GlobalStep int              `json:"global_step"`
		LogHistory []map[string]any `json:"log_history"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return 0, nil, fmt.Errorf("ValueError: %s/trainer_state.json is not valid JSON: %w", t.a.resumeFrom, err)
	}
	return st.GlobalStep, st.LogHistory, nil
}

// rayResultKeys are the keys Ray Train/Tune add to every report; the
// completion mark's checkpoint metrics leave them out.
var rayResultKeys = map[string]bool{
	"checkpoint_dir_name": true, "config": true, "date": true, "done": true, "experiment_tag": true,
	"hostname": true, "iterations_since_restore": true, "node_ip": true, "pid": true,
	"should_checkpoint": true, "time_since_restore": true, "time_this_iter_s": true,
	"time_total_s": true, "timestamp": true, "training_iteration": true, "trial_id": true,
	"timesteps_since_restore": true, "timesteps_total": true, "episodes_total": true,
}

var finalKeys = []string{
	"train_loss", "train_runtime", "train_tokens", "tokens_per_second", "train_samples_per_second",
	"train_steps_per_second", "train_steps", "global_step", "epoch", "total_flos", "loss",
	"mean_token_accuracy", "num_tokens", "train_loss_tokens",
}

// writeMark writes the completion mark (checkpoints.MarkFile) the way trainer/result.py builds it
// from the trial's reports.
func (t *trainer) writeMark(ctx context.Context, status string, errText any) error {
	a := t.a
	expURI := gsURI(a.bucket, a.experimentName())
	var trialURI any
	written := []any{}
	var latest any
	final := map[string]any{}
	if t.trial != "" {
		tu := gsURI(a.bucket, t.trial)
		trialURI = tu
		for _, row := range t.rows {
			name, _ := row["checkpoint_dir_name"].(string)
			if name == "" {
				continue
			}
			metrics := map[string]any{}
			for k, v := range row {
				if !rayResultKeys[k] {
					metrics[k] = v
				}
			}
			path := tu + "/" + name
			written = append(written, map[string]any{
				"path": path, "dirName": name, "modelPath": path + "/checkpoint",
				"step": row["step"], "epoch": row["epoch"], "metrics": metrics,
			})
			latest = path
		}
		for i := len(t.rows) - 1; i >= 0; i-- {
			if _, ok := t.rows[i]["train_runtime"]; ok {
				for _, k := range finalKeys {
					if v, ok := t.rows[i][k]; ok {
						final[k] = v
					}
				}
				break
			}
		}
	}
	var data any
	for i := len(t.rows) - 1; i >= 0; i-- {
		if n, ok := t.rows[i]["dataset_rows"]; ok {
			data = map[string]any{"rows": n, "droppedRows": t.rows[i]["dropped_rows"], "maxSeqLength": t.rows[i]["max_seq_length"], "evalRows": t.rows[i]["eval_rows"]}
			break
		}
	}
	doc := map[string]any{
		"data":             data,
		"samples":          t.samples,
		"schemaVersion":    1,
		"runId":            a.runID,
		"status":           status,
		"error":            errText,
		"experimentPath":   expURI,
		"trialPath":        trialURI,
		"checkpoints":      written,
		"latestCheckpoint": latest,
		"finalMetrics":     final,
		"noticeSeen":       t.notice,
	}
	name := a.experimentName() + "/" + checkpoints.MarkFile
	if err := t.st.put(ctx, a.bucket, name, mustJSON(doc)); err != nil {
		return err
	}
	t.p.update(func(r *JobRecord) { r.Mark = gsURI(a.bucket, name) })
	t.logf("raydrop: %s; wrote %s", status, gsURI(a.bucket, name))
	if err := t.copyLog(ctx); err != nil {
		return err
	}
	// Then the notice that announces it, as trainer/train.py _announce():
	// a notice that cannot be written is logged, not a failed job (the
	// sweep finds the mark).
	if a.markNotice != "" {
		nb, np, _ := splitGS(a.markNotice)
		if err := t.st.put(ctx, nb, np, mustJSON(map[string]any{"mark": gsURI(a.bucket, name)})); err != nil {
			t.p.log().Warn("could not write the mark notice", "notice", a.markNotice, "err", err)
		}
	}
	return nil
}

// errorTxt is Ray Tune's error.txt for a failed trial.
func (t *trainer) errorTxt(errText string) string {
	typ, msg, _ := strings.Cut(errText, ": ")
	return fmt.Sprintf("Failure # 1 (occurred at %s)\nray::_Inner.train() (pid=4242, ip=10.244.0.2, repr=TorchTrainer)\n"+
		"ray.exceptions.RayTaskError(%s): ray::_RayTrainWorker__execute.get_next() (pid=4243, ip=10.244.0.2)\n"+
		"  File \"/code/worker.py\", in train_func\n%s: %s\n",
		time.Now().UTC().Format("2006-01-02_15-04-05"), typ, typ, msg)
}
