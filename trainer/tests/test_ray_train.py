"""End to end on CPU: `python train.py` under a real Ray Train TorchTrainer with
two workers and the real SFTTrainer, on the tiny Gemma 3 and the toy dataset.

One training run; the next two attempts of one run, each resumed (through a
URI, as from Cloud Storage) from the newest checkpoint before it; and
failing runs; the tests read what they left in the storage path, as the
pipeline does.
If RAYDROP_LAYOUT_DIR is set, the storage tree is copied there afterwards.
"""

from __future__ import annotations

import collections
import glob
import json
import math
import os
import shutil
import subprocess
import sys

import pytest

import tiny
from conftest import TRAINER_DIR, check_mark

STEPS = 24
SAVE_STEPS = 12
WORKERS = 2
GA = 2
SAMPLES_PER_STEP = WORKERS * 1 * GA


def run_trainer(ray_address, storage, experiment, assets, extra=(), timeout=600, run_id=None, env_extra=None):
    argv = trainer_argv(storage, experiment, assets, extra, run_id)
    env = dict(os.environ, RAY_ADDRESS=ray_address, **(env_extra or {}))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=timeout)
    return proc


def trainer_argv(storage, experiment, assets, extra, run_id):
    return [
        sys.executable, os.path.join(TRAINER_DIR, "train.py"),
        "--run-id", run_id or "test-" + experiment,
        "--storage-path", storage,
        "--experiment-name", experiment,
        "--model-id", assets["model"],
        "--dataset-id", assets["dataset"],
        "--dataset-split", "train",
        "--num-workers", str(WORKERS), "--use-gpu", "false",
        "--quantization", "none", "--attention", "sdpa",
        "--lora-r", "8", "--lora-alpha", "16", "--lora-dropout", "0.0", "--lora-target-modules", "all-linear",
        "--lora-vision-tower", "false", "--train-embeddings", "false", "--completion-only-loss", "true",
        "--epochs", "100", "--per-device-batch-size", "1", "--gradient-accumulation-steps", str(GA),
        "--learning-rate", "0.01", "--lr-scheduler", "constant", "--warmup-ratio", "0.0",
        "--max-grad-norm", "1.0", "--max-seq-length", "512", "--max-dropped-share", "0.1",
        "--logging-steps", "2", "--save-strategy", "steps", "--save-steps", str(SAVE_STEPS),
        "--gradient-checkpointing", "false", "--seed", "42",
        "--max-steps", str(STEPS), "--dataloader-num-workers", "0",
    ] + list(extra)


def results(storage, experiment):
    trials = glob.glob(os.path.join(storage, experiment, "TorchTrainer_*"))
    assert len(trials) == 1, trials
    with open(os.path.join(trials[0], "result.json")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return trials[0], rows


def mark(storage, experiment):
    """The experiment's completion mark, checked against schemas/mark.v1.json."""
    with open(os.path.join(storage, experiment, "raydrop_result.json")) as f:
        return check_mark(json.load(f))


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("storage"))
    yield path
    layout = os.environ.get("RAYDROP_LAYOUT_DIR")
    if layout:
        shutil.copytree(path, layout, dirs_exist_ok=True)


@pytest.fixture(scope="module")
def run_a(ray_address, storage, assets):
    # Ray's driver holds back a worker's line that another worker printed too, for
    # this window, and prints what it still holds when it disconnects. An hour makes
    # every such line wait for the disconnect: driver.log must not lose them
    # (test_driver_log_is_kept_beside_the_run).
    proc = run_trainer(ray_address, storage, "exp-a", assets, env_extra={"RAY_DEDUP_LOGS_AGG_WINDOW_S": "3600"})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return proc


def resume_attempt(ray_address, storage, assets, prev, checkpoint, experiment, max_steps):
    """The next attempt of run "test-resume", resuming (through a file:// URI, as
    from Cloud Storage) from checkpoint of experiment prev."""
    trial, _ = results(storage, prev)
    uri = "file://" + os.path.join(trial, checkpoint)
    proc = run_trainer(ray_address, storage, experiment, assets, run_id="test-resume",
                       extra=["--resume-from", uri, "--max-steps", str(max_steps)])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def run_b(ray_address, storage, assets, run_a):
    """The second attempt, from exp-a's first checkpoint."""
    return resume_attempt(ray_address, storage, assets, "exp-a", "checkpoint_000000", "exp-b", STEPS + 4)


@pytest.fixture(scope="module")
def run_c(ray_address, storage, assets, run_b):
    """The third attempt, on the same nodes, from the second's newest; its last
    step (an odd one) is not a logging step."""
    return resume_attempt(ray_address, storage, assets, "exp-b", "checkpoint_000001", "exp-c", STEPS + 9)


def resume_copies():
    """The checkpoint copies left on the (one) node's scratch volume."""
    cache = os.path.join(os.environ["RAYDROP_SCRATCH"], "raydrop-resume")
    return os.listdir(cache) if os.path.isdir(cache) else []


def test_layout_is_ray_train_v1(run_a, storage):
    exp = os.path.join(storage, "exp-a")
    assert glob.glob(os.path.join(exp, "experiment_state-*.json"))
    trial, rows = results(storage, "exp-a")
    assert os.path.isfile(os.path.join(trial, "params.json"))
    assert os.path.isfile(os.path.join(trial, "progress.csv"))
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(trial, "checkpoint_*")))
    assert names == ["checkpoint_000000", "checkpoint_000001"]
    for name in names:
        files = set(os.listdir(os.path.join(trial, name, "checkpoint")))
        for required in ("adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt",
                         "trainer_state.json", "processor_config.json", "tokenizer_config.json"):
            assert required in files, (name, sorted(files))
        assert any(f.startswith("rng_state") for f in files), sorted(files)
        # Only rank 0 persisted: no other rank's RNG file was merged in.
        assert not any(f.startswith("rng_state_1") for f in files), sorted(files)
        # Adapter only: no full copies of embeddings/LM head.
        assert os.path.getsize(os.path.join(trial, name, "checkpoint", "adapter_model.safetensors")) < 2_000_000


def test_reported_metrics(run_a, storage):
    _, rows = results(storage, "exp-a")
    saved = [r for r in rows if r.get("checkpoint_dir_name")]
    assert [r["checkpoint_dir_name"] for r in saved] == ["checkpoint_000000", "checkpoint_000001"]
    assert [r["step"] for r in saved] == [SAVE_STEPS, STEPS]
    for r in rows[:-1]:
        for key in ("step", "epoch", "loss", "learning_rate", "grad_norm"):
            assert key in r, (key, r)
    final = rows[-1]
    assert final["train_runtime"] > 0 and final["global_step"] == STEPS
    assert final["latest_checkpoint_dir_name"] == "checkpoint_000001"


def test_first_report_tells_how_the_worker_started(run_a, storage):
    """The first report, and only it, carries rank 0's own start-up account (the pipeline's
    checkpoints.TrainerStartup): when its train function began, the seconds for the model
    and for the data, and when the first optimizer step ended, before Ray stamped the report."""
    _, rows = results(storage, "exp-a")
    first = rows[0].get("raydrop_startup")
    assert first is not None, rows[0]
    assert set(first) == {"started_at", "weights_s", "data_s", "first_step_at", "stage_s"}, first
    assert first["weights_s"] > 0 and first["data_s"] > 0 and first["stage_s"] == 0, first  # nothing staged
    assert first["started_at"] + first["weights_s"] + first["data_s"] <= first["first_step_at"], first
    assert first["first_step_at"] <= rows[0]["timestamp"] + 1, (first, rows[0]["timestamp"])
    assert all("raydrop_startup" not in r for r in rows[1:])


def test_every_checkpoint_is_evaluated_on_held_out_rows(run_a, storage):
    _, rows = results(storage, "exp-a")
    saved = [r for r in rows if r.get("checkpoint_dir_name")]
    # 5 % of the 16 rows that fit, at least one, held out with the seed.
    assert all(r["eval_rows"] == 1 and r["dataset_rows"] == 17 for r in rows)
    losses = [r["eval_loss"] for r in saved]
    assert len(losses) == 2 and all(0 < x < math.log(tiny.VOCAB_SIZE) + 1.5 for x in losses), losses
    assert losses[1] < losses[0], losses  # the model learns what the held-out row's category says
    assert all(r["eval_tokens"] > 0 for r in saved)
    # Logging lines carry no evaluation: an eval_loss is its checkpoint's own.
    assert not any("eval_loss" in r for r in rows if not r.get("checkpoint_dir_name"))
    doc = mark(storage, "exp-a")
    assert [c["metrics"]["eval_loss"] for c in doc["checkpoints"]] == losses


def test_sample_answers_by_rank_0(run_a, storage):
    folder = os.path.join(storage, "exp-a", "samples")
    with open(os.path.join(folder, "samples.json")) as f:
        doc = json.load(f)
    # --sample-answers 8 of the one held-out row.
    assert doc["count"] == 1 and len(doc["samples"]) == 1 and doc["seconds"] > 0
    (s,) = doc["samples"]
    for key in ("prompt", "reference", "base", "tuned"):
        assert isinstance(s[key], str), (key, s)
    assert s["prompt"].endswith("<start_of_turn>model\n") and s["reference"] in [d for _, d in tiny.CATEGORIES.values()]
    assert "<PRODUCT>" in s["prompt"]  # the tutorial's prompt, from the template's defaults
    assert s["images"] == ["sample-00-0.png"]
    assert sorted(os.listdir(folder)) == ["sample-00-0.png", "samples.json"]
    for model in ("base", "tuned"):
        score = doc["scores"][model]
        assert score["exactMatch"] == (1.0 if s[model] == s["reference"] else 0.0)
        assert 0.0 <= score["tokenF1"] <= 1.0
    from PIL import Image

    assert Image.open(os.path.join(folder, s["images"][0])).size == (48, 40)
    assert (run_a.stdout + run_a.stderr).count("wrote 1 sample answers") == 1  # rank 0 only
    assert mark(storage, "exp-a")["samples"] == {
        "uri": os.path.join(storage, "exp-a", "samples", "samples.json"), "count": 1, "seconds": doc["seconds"]}


def test_loss_is_true_token_mean_and_falls(run_a, storage):
    _, rows = results(storage, "exp-a")
    losses = [r["loss"] for r in rows if "loss" in r and "train_runtime" not in r]
    # Random init: about ln(vocab). Scaled by GA x world size it would be ~4x that.
    assert 3.0 < losses[0] < math.log(tiny.VOCAB_SIZE) + 1.5, losses
    assert losses[-1] < 0.8 * losses[0], losses


def test_loss_covers_only_the_answer(run_a, storage, processor, dataset):
    import data

    _, rows = results(storage, "exp-a")
    final = rows[-1]
    completion = [len(data.encode_text(processor, dataset[i])[1]) for i in range(len(dataset) - 1)]
    per_sample = final["train_loss_tokens"] / (STEPS * SAMPLES_PER_STEP)
    assert min(completion) <= per_sample <= max(completion), (per_sample, completion)
    assert final["train_tokens"] / (STEPS * SAMPLES_PER_STEP) > 300  # whole sequences went in


def test_completion_mark_after_success(run_a, storage):
    trial, rows = results(storage, "exp-a")
    doc = mark(storage, "exp-a")
    assert doc["status"] == "succeeded" and doc["error"] is None
    # The toy dataset's one over-long row, left out and counted (1 of 17 is
    # within the 0.1 allowed here).
    assert doc["data"] == {"rows": 17, "droppedRows": 1, "maxSeqLength": 512, "evalRows": 1}
    assert all(r["dropped_rows"] == 1 and r["dataset_rows"] == 17 for r in rows)
    assert doc["trialPath"] == trial
    assert [c["step"] for c in doc["checkpoints"]] == [SAVE_STEPS, STEPS]
    assert doc["latestCheckpoint"] == os.path.join(trial, "checkpoint_000001")
    assert os.path.isdir(doc["checkpoints"][0]["modelPath"])
    fm = doc["finalMetrics"]
    for key in ("train_loss", "train_runtime", "train_tokens", "tokens_per_second"):
        assert fm[key] > 0, (key, fm)
    assert fm["tokens_per_second"] == pytest.approx(fm["train_tokens"] / fm["train_runtime"])


def test_driver_log_is_kept_beside_the_run(run_a, storage):
    """Everything the driver printed, its own lines and the workers' that Ray
    forwards to it, is copied beside the run (driver.log)."""
    with open(os.path.join(storage, "exp-a", "driver.log"), encoding="utf-8") as f:
        kept = f.read()
    printed = [line for line in (run_a.stdout + run_a.stderr).splitlines() if line.strip()]
    assert printed and all(line in kept for line in printed), [line for line in printed if line not in kept][:5]
    assert "raydrop: run test-exp-a:" in kept and "raydrop: succeeded; wrote" in kept
    assert "trainable parameters:" in kept  # a worker's line, forwarded by Ray


def test_resume_continues_from_saved_step(run_b, storage):
    _, rows = results(storage, "exp-b")
    first = rows[0]
    assert first["resumed_from_step"] == SAVE_STEPS
    assert first["resumed_optimizer_step"] == SAVE_STEPS  # AdamW state came back
    assert first["resumed_scheduler_step"] == SAVE_STEPS
    assert first["step"] > SAVE_STEPS
    final = rows[-1]
    assert final["global_step"] == STEPS + 4 and final["train_steps"] == STEPS + 4 - SAVE_STEPS
    trial, _ = results(storage, "exp-b")
    with open(os.path.join(trial, "checkpoint_000000", "checkpoint", "trainer_state.json")) as f:
        state = json.load(f)
    assert state["global_step"] == SAVE_STEPS * 2
    assert min(h["step"] for h in state["log_history"]) < SAVE_STEPS  # history of the first run
    doc = mark(storage, "exp-b")
    assert doc["status"] == "succeeded"
    assert [c["step"] for c in doc["checkpoints"]] == [SAVE_STEPS * 2, STEPS + 4]
    assert resume_copies() == []  # the copy it trained from is gone once loaded


def test_third_attempt_resumes_from_the_newest_checkpoint(run_c, storage):
    _, b_rows = results(storage, "exp-b")
    newest_b = [r["step"] for r in b_rows if r.get("checkpoint_dir_name")][-1]
    assert newest_b == STEPS + 4
    _, rows = results(storage, "exp-c")
    assert rows[0]["resumed_from_step"] == newest_b, rows[0]
    assert rows[0]["resumed_optimizer_step"] == newest_b
    assert rows[-1]["global_step"] == STEPS + 9 and rows[-1]["train_steps"] == 5
    assert mark(storage, "exp-c")["status"] == "succeeded"
    assert resume_copies() == []


def test_every_rank_left_its_heartbeat(run_c, storage):
    """Each rank's heartbeat (heartbeat.py) in its attempt's experiment folder: the
    resumed attempt's last step, its own first step, and the end of training."""
    import heartbeat

    beats = sorted(glob.glob(os.path.join(storage, "exp-c", heartbeat.DIR, "rank-*.json")))
    assert [os.path.basename(b) for b in beats] == ["rank-00000.json", "rank-00001.json"], beats
    for path in beats:
        with open(path) as f:
            doc = json.load(f)
        assert doc["step"] == STEPS + 9 and doc["activity"] == "ended", doc
        assert doc["firstStepAt"] <= doc["stepAt"] <= doc["at"], doc
        assert doc["stepSeconds"] > 0, doc


def test_train_loss_is_the_mean_over_all_ranks(run_c, storage):
    """The last step is logged even off the logging interval, so train_loss is
    the mean of the logged losses (each the mean over both ranks), not one
    with rank 0's own loss for the steps after the last log."""
    _, rows = results(storage, "exp-c")
    logged = {r["step"]: r["loss"] for r in rows[:-1] if "loss" in r}
    assert sorted(logged) == [STEPS + 6, STEPS + 8, STEPS + 9], sorted(logged)
    start = STEPS + 4
    total, prev = 0.0, start
    for step in sorted(logged):
        total += logged[step] * (step - prev)  # each log is the mean step loss since the previous one
        prev = step
    assert rows[-1]["train_loss"] == pytest.approx(total / (STEPS + 9 - start), rel=1e-3)


def test_resuming_a_copy_that_is_not_the_recorded_checkpoint_fails(ray_address, storage, assets, run_a, tmp_path):
    """The step the attempt resumes at must be the one Ray Train recorded for the
    checkpoint it was told to resume from, not merely the copy's own."""
    trial, _ = results(storage, "exp-a")
    wrong = tmp_path / os.path.basename(trial)
    shutil.copytree(trial, wrong)
    # The folder recorded as checkpoint_000000 (step 12) holds step 24's files.
    shutil.rmtree(wrong / "checkpoint_000000")
    shutil.copytree(wrong / "checkpoint_000001", wrong / "checkpoint_000000")
    proc = run_trainer(ray_address, storage, "exp-wrong", assets, run_id="test-wrong",
                       extra=["--resume-from", "file://" + str(wrong / "checkpoint_000000"),
                              "--max-steps", str(STEPS + 2)])
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    error = mark(storage, "exp-wrong")["error"]
    assert f"resumed at step {STEPS}" in error and f"at step {SAVE_STEPS}" in error, error


def test_too_many_long_rows_fail_before_training(ray_address, storage, assets):
    proc = run_trainer(ray_address, storage, "exp-long", assets, extra=["--max-dropped-share", "0.05"])
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = mark(storage, "exp-long")
    assert doc["status"] == "failed" and doc["checkpoints"] == []
    assert doc["error"].startswith("ValueError: 1 of 17 rows (5.9 %) are longer than --max-seq-length 512"), doc["error"]
    assert "--max-dropped-share 0.05" in doc["error"] and "training.maxSeqLength" in doc["error"]


def test_failed_run_writes_mark(ray_address, storage, assets):
    bad = dict(assets, dataset=os.path.join(storage, "no-such-dataset"))
    notice = os.path.join(storage, "raydrop-marks", "exp-fail", "attempt-1.json")
    proc = run_trainer(ray_address, storage, "exp-fail", bad, extra=["--max-steps", "2", "--mark-notice", notice])
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(notice) as f:  # announced after the mark, naming it
        assert json.load(f)["mark"] == os.path.join(storage, "exp-fail", "raydrop_result.json")
    doc = mark(storage, "exp-fail")
    assert doc["status"] == "failed" and doc["noticeSeen"] is False, doc
    assert doc["error"] and "no-such-dataset" in doc["error"], doc["error"]
    assert doc["checkpoints"] == [] and doc["latestCheckpoint"] is None and doc["finalMetrics"] == {}


def test_sigterm_saves_a_checkpoint_and_the_next_attempt_resumes(ray_address, storage, assets):
    """A SIGTERM to the driver mid-epoch (`ray job stop`) gives the workers notice:
    they finish the step, save a checkpoint of it through Ray Train and stop; the mark
    says preempted, and the next attempt resumes from that checkpoint.

    On GKE the driver runs in the head pod and shares no filesystem with the
    GPU workers, so here it runs in its own mount namespace, where the folder
    of the workers' notice file is a private tmpfs: whatever the driver writes
    there, the workers never see."""
    import signal
    import time

    private = os.path.dirname(os.environ["RAYDROP_NOTICE_FILE"])
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "mount", "-t", "tmpfs", "probe", private],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no mount namespace for the driver here: {probe.stderr.strip()}")
    # Long enough that the notice, not the step limit, ends it.
    long_run = 400
    proc = start_trainer(ray_address, storage, "exp-p", assets, dict(os.environ), run_id="test-notice",
                         extra=["--max-steps", str(long_run), "--save-steps", str(long_run)],
                         wrap=["unshare", "--mount", "--propagation", "private", "sh", "-c",
                               'mount -t tmpfs driver-only "$0" && exec "$@"', private])
    result_path = None
    deadline = time.time() + 400
    while time.time() < deadline and proc.poll() is None:
        found = glob.glob(os.path.join(storage, "exp-p", "TorchTrainer_*", "result.json"))
        if found and os.path.getsize(found[0]) > 0:
            result_path = found[0]
            break
        time.sleep(0.5)
    assert result_path, "no step reported before the deadline: " + (proc.communicate()[0] or "")[-6000:]
    with open(result_path) as f:
        seen_step = max(json.loads(line)["step"] for line in f if line.strip())
    os.kill(proc.pid, signal.SIGTERM)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail("the workers never got the driver's notice: " + out[-6000:])
    assert proc.returncode == 3, out[-6000:]
    assert "SIGTERM: gave the workers notice" in out

    m = mark(storage, "exp-p")
    assert m["status"] == "preempted", m
    assert m["noticeSeen"] is True, m
    trial, rows = results(storage, "exp-p")
    last = rows[-1]
    stopped = last["preempted_at_step"]
    assert seen_step < stopped < long_run, (seen_step, stopped)
    saved = [r for r in rows if r.get("checkpoint_dir_name")]
    assert saved and saved[-1]["step"] == stopped, saved
    assert m["latestCheckpoint"].endswith(saved[-1]["checkpoint_dir_name"]), m["latestCheckpoint"]
    assert os.path.exists(os.path.join(trial, saved[-1]["checkpoint_dir_name"], "checkpoint", "adapter_model.safetensors"))

    uri = "file://" + os.path.join(trial, saved[-1]["checkpoint_dir_name"])
    resumed = run_trainer(ray_address, storage, "exp-q", assets, run_id="test-notice",
                          extra=["--resume-from", uri, "--max-steps", str(stopped + 2)])
    assert resumed.returncode == 0, resumed.stdout[-6000:] + resumed.stderr[-6000:]
    _, rows = results(storage, "exp-q")
    assert rows[0]["resumed_from_step"] == stopped and rows[-1]["global_step"] == stopped + 2, rows[0]
    assert mark(storage, "exp-q")["status"] == "succeeded"


def start_trainer(ray_address, storage, experiment, assets, env, run_id, extra=(), wrap=()):
    """run_trainer's command, started in the background with env (run by wrap, if given)."""
    argv = list(wrap) + trainer_argv(storage, experiment, assets, extra, run_id)
    env = dict(env, RAY_ADDRESS=ray_address)
    env.pop("PYTHONPATH", None)
    return subprocess.Popen(argv, env=env, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_messages_with_zero_one_and_two_images_from_a_file_uri(ray_address, storage, assets, tmp_path):
    """The messages format (0, 1 and 2 images a row, several turns) read from a
    file:// folder of JSON Lines, trained and answered under Ray Train; the
    format arrives through the environment variable the pipeline sets."""
    folder = tiny.write_messages_jsonl(str(tmp_path / "conv"), n=12)
    env_format = json.dumps({"format": "messages"})
    argv = trainer_argv(storage, "exp-msg", {**assets, "dataset": "file://" + folder},
                        ["--max-steps", "4", "--save-steps", "4", "--sample-answers", "3", "--eval-share", "0.25"], None)
    env = dict(os.environ, RAY_ADDRESS=ray_address, RAYDROP_DATASET_FORMAT=env_format)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(argv, env=env, cwd="/", capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    doc = mark(storage, "exp-msg")
    assert doc["status"] == "succeeded" and len(doc["checkpoints"]) == 1
    with open(os.path.join(storage, "exp-msg", "samples", "samples.json")) as f:
        samples = json.load(f)
    assert samples["count"] == 3
    # Every held-out row's images were written, however many it had.
    assert sum(len(s["images"]) for s in samples["samples"]) == len(
        [n for n in os.listdir(os.path.join(storage, "exp-msg", "samples")) if n.endswith(".png")])
    assert all(s["prompt"].endswith("<start_of_turn>model\n") for s in samples["samples"])


def test_a_workers_notice_file_reaches_the_drivers_mark(ray_address, storage, assets):
    """A worker pod's preStop hook leaves the notice file on its node; the worker
    that finds it puts the attempt's key in Ray's store before the save, so the
    driver's mark says a notice came (noticeSeen), even though the driver itself
    got no SIGTERM: had the node died during the save, the failed mark would
    still tell the pipeline that the attempt was preempted."""
    import time

    import notice

    where = os.environ["RAYDROP_NOTICE_FILE"]
    if os.path.exists(where):
        os.remove(where)
    long_run = 400
    proc = start_trainer(ray_address, storage, "exp-file", assets, dict(os.environ), run_id="test-file-notice",
                         extra=["--max-steps", str(long_run), "--save-steps", str(long_run)])
    try:
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            found = glob.glob(os.path.join(storage, "exp-file", "TorchTrainer_*", "result.json"))
            if found and os.path.getsize(found[0]) > 0:
                break
            time.sleep(0.5)
        else:
            pytest.fail("no step reported before the deadline: " + (proc.communicate()[0] or "")[-6000:])
        notice.give(where)  # what the preStop hook does
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            pytest.fail("the workers never saw their notice file: " + out[-6000:])
    finally:
        if os.path.exists(where):
            os.remove(where)
    assert proc.returncode == 3, out[-6000:]
    assert "SIGTERM: gave the workers notice" not in out, out[-6000:]
    m = mark(storage, "exp-file")
    assert m["status"] == "preempted" and m["noticeSeen"] is True, m


def test_workers_share_one_node_copy_of_the_staged_model(ray_address, storage, assets, tmp_path):
    """--stage-model true: the driver streams the model from the Hub (a fake one) into the
    bucket (a file:// folder) before training; the two workers, on one node, load one copy
    of it that the first of them made in the node's scratch volume. The workers' own
    environment is offline, so a worker that went to the Hub for --model-id would fail."""
    import fakehub
    import weights

    uri = "file://" + str(tmp_path / "bucket" / "models" / fakehub.REPO / fakehub.COMMIT)
    with fakehub.FakeHub.of_folder(assets["model"]) as hub:
        proc = run_trainer(ray_address, storage, "exp-staged", {**assets, "model": fakehub.REPO},
                           extra=["--staged-model", uri, "--stage-model", "true", "--model-revision", fakehub.COMMIT,
                                  "--max-steps", "2", "--save-steps", "2"],
                           env_extra={"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert mark(storage, "exp-staged")["status"] == "succeeded"
    model_files = sorted(os.listdir(assets["model"]))
    assert hub.gets == collections.Counter({n: 1 for n in model_files})  # the Hub read once, by the driver
    assert f"raydrop: model: staging {len(model_files)} files of {fakehub.REPO}@{fakehub.COMMIT}" in out
    assert f"raydrop: model staged at {uri} in " in out

    dest = weights.node_dir(os.environ["RAYDROP_SCRATCH"], fakehub.REPO, fakehub.COMMIT)
    assert sorted(set(os.listdir(dest)) - {weights.NODE_COMPLETE}) == model_files
    with open(dest + weights.NODE_FETCHES_SUFFIX, encoding="utf-8") as f:
        fetches = [json.loads(line) for line in f]
    assert len({r["pid"] for r in fetches}) == WORKERS == len(fetches), fetches
    assert sorted(r["copied"] for r in fetches) == [False, True], fetches
    for rank in range(WORKERS):
        assert f"model: rank {rank} loads {dest}" in out, out[-6000:]
    # The driver's staging is in the first report's account, apart from the workers' own time.
    _, rows = results(storage, "exp-staged")
    assert rows[0]["raydrop_startup"]["stage_s"] > 0, rows[0]["raydrop_startup"]


def test_a_staging_failure_leaves_no_mark(ray_address, storage, assets, tmp_path):
    """The Hub refuses the staging (here: it has no such repository): the driver exits 1
    and writes no completion mark, so the pipeline treats the attempt as a job that ended
    without one and retries it, rather than as the training code's own failure."""
    import fakehub

    uri = "file://" + str(tmp_path / "bucket" / "models" / "google" / "gone" / fakehub.COMMIT)
    with fakehub.FakeHub.of_folder(assets["model"]) as hub:
        proc = run_trainer(ray_address, storage, "exp-stage-fails", {**assets, "model": "google/gone"},
                           extra=["--staged-model", uri, "--stage-model", "true", "--model-revision", fakehub.COMMIT],
                           env_extra={"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert f"could not stage the model at {uri}" in out and "no completion mark" in out, out[-4000:]
    assert not os.path.exists(os.path.join(storage, "exp-stage-fails", "raydrop_result.json"))


def test_the_ray_log_collector_copies_a_real_sessions_logs(ray_address, ray_logs, tmp_path):
    """The collector (raylogs.py) over a real Ray session's log folder: Ray's own logs and a
    worker process's output file, with a line a task printed, land in the destination; a
    second copy writes only what changed."""
    import time

    import ray

    import raylogs

    marker = f"raylogs-marker-{os.getpid()}-{time.time_ns()}"

    @ray.remote
    def say(text):
        print(text, flush=True)
        return os.getpid()

    pid = ray.get(say.remote(marker))
    # The worker's standard output goes to worker-<id>-<job>-<pid>.out in the log folder.
    deadline = time.time() + 30
    while True:
        outs = [p for p in glob.glob(os.path.join(ray_logs, f"worker-*-{pid}.out")) if marker in open(p, errors="replace").read()]
        if outs or time.time() > deadline:
            break
        time.sleep(0.2)
    assert outs, sorted(os.listdir(ray_logs))
    dest = tmp_path / "evidence" / "ray" / "head"
    c = raylogs.Collector(ray_logs, str(dest))
    written, err = c.sync()
    assert err is None and written >= 3, (written, err)
    for name in ("raylet.out", "gcs_server.out", os.path.basename(outs[0])):
        assert (dest / name).exists(), sorted(os.listdir(dest))
    assert marker in (dest / os.path.basename(outs[0])).read_text(errors="replace")
    index = json.loads((dest / raylogs.INDEX).read_text())
    assert index["files"]["raylet.out"]["bytes"] > 0
    # Ray keeps writing (raylet's periodic lines, the task's): a copy soon after
    # writes some files again, not all of them.
    again, err = c.sync()
    assert err is None and again < written, (again, written)
