"""The Ray log collector: copies a node's Ray log folder beside the run, the changed
files only, each capped, every few seconds and once more on SIGTERM. (Against a real Ray
session's folder: test_ray_train.py.)"""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import raylogs


def _layout(logs):
    (logs / "old_logs").mkdir(parents=True)
    (logs / "raylet.out").write_text("raylet started\n")
    (logs / "worker-ab12-01000000-4242.out").write_text("rank 3: step 1\n")
    (logs / "old_logs" / "gcs_server.err").write_text("")


def test_copies_the_folder_then_only_what_changed(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    _layout(logs)
    c = raylogs.Collector(str(logs), str(dest))
    assert c.sync() == (3, None)
    for rel in ("raylet.out", "worker-ab12-01000000-4242.out", "old_logs/gcs_server.err"):
        assert (dest / rel).read_bytes() == (logs / rel).read_bytes()
    assert c.sync() == (0, None)  # nothing changed: nothing written
    with open(logs / "worker-ab12-01000000-4242.out", "a") as f:
        f.write("rank 3: CUDA out of memory\n")
    (logs / "runtime_env_agent.log").write_text("agent\n")
    assert c.sync() == (2, None)
    assert (dest / "worker-ab12-01000000-4242.out").read_text().endswith("CUDA out of memory\n")
    index = json.loads((dest / raylogs.INDEX).read_text())
    assert index["files"]["runtime_env_agent.log"] == {"bytes": 6, "kept": 6, "capped": False}
    assert set(index["files"]) == {"raylet.out", "worker-ab12-01000000-4242.out", "old_logs/gcs_server.err", "runtime_env_agent.log"}


def test_a_long_file_keeps_its_end(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    logs.mkdir()
    big = b"".join(b"line %06d\n" % i for i in range(10000))  # 120,000 bytes
    (logs / "worker-1.out").write_bytes(big)
    c = raylogs.Collector(str(logs), str(dest), cap=1000)
    assert c.sync() == (1, None)
    assert (dest / "worker-1.out").read_bytes() == big[-1000:]
    assert json.loads((dest / raylogs.INDEX).read_text())["files"]["worker-1.out"] == {"bytes": len(big), "kept": 1000, "capped": True}


def test_a_failed_copy_is_reported_and_tried_again(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    _layout(logs)
    dest.mkdir()
    (dest / "old_logs").write_text("a file where the folder should be")
    c = raylogs.Collector(str(logs), str(dest))
    written, err = c.sync()
    assert written == 2 and "old_logs" in err
    (dest / "old_logs").unlink()
    assert c.sync() == (1, None)  # only the one that failed
    assert (dest / "old_logs" / "gcs_server.err").exists()


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match="cap 0"):
        raylogs.Collector(str(tmp_path), str(tmp_path / "d"), cap=0)
    proc = subprocess.run([sys.executable, "raylogs.py", "--dest", str(tmp_path / "d"), "--every", "0"],
                          capture_output=True, text=True, cwd=os.path.dirname(raylogs.__file__))
    assert proc.returncode == 2 and "--every 0.0: must be a positive number of seconds" in proc.stderr


def _first_copy(proc, dest):
    """Waits for the collector's first copy into dest, made at its start."""
    deadline = time.time() + 30
    while not (dest / raylogs.INDEX).exists():
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read() if proc.poll() is not None else "no first copy"
        time.sleep(0.05)


def test_sigterm_copies_once_more_then_exits(tmp_path):
    logs, dest = tmp_path / "logs", tmp_path / "dest"
    _layout(logs)
    proc = subprocess.Popen([sys.executable, "raylogs.py", "--logs", str(logs), "--dest", str(dest), "--every", "3600"],
                            cwd=os.path.dirname(raylogs.__file__), stderr=subprocess.PIPE, text=True)
    _first_copy(proc, dest)
    with open(logs / "raylet.out", "a") as f:
        f.write("raylet: SIGTERM received, shutting down\n")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert (dest / "raylet.out").read_text().endswith("SIGTERM received, shutting down\n")


def _job(submission_id, start_ms, evidence=None, end_ms=None, status="RUNNING"):
    """A job as the head's GET /api/jobs/ gives it: Ray's own JobDetails, dumped as
    ray/dashboard/modules/job/job_head.py list_jobs dumps it."""
    from ray.dashboard.modules.job.common import JobStatus
    from ray.dashboard.modules.job.pydantic_models import JobDetails, JobType

    env = {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "45"}}
    if evidence:
        env["env_vars"][raylogs.EVIDENCE_ENV] = evidence
    d = JobDetails(type=JobType.SUBMISSION, submission_id=submission_id, job_id="02000000", status=JobStatus(status),
                   entrypoint="python /code/train.py", start_time=start_ms, end_time=end_ms, runtime_env=env)
    return json.loads(json.dumps(d.dict()))


def _touch(path, text, when):
    path.write_text(text)
    os.utime(path, (when, when))


def test_the_follower_copies_to_the_latest_jobs_folder(tmp_path):
    """The sidecar's mode: the node's logs written since the head's latest job started go
    to the evidence folder that job names; an older job's files, a job that names no
    folder, and the time after an ended job's linger get no copy."""
    logs, ev1, ev2 = tmp_path / "logs", tmp_path / "run-a" / "evidence" / "attempt-1", tmp_path / "run-b" / "evidence" / "attempt-1"
    logs.mkdir()
    t0 = 1_800_000_000.0
    _touch(logs / "worker-aa-01000000-100.out", "an earlier run's rank\n", t0 - 600)
    _touch(logs / "raylet.out", "raylet up\n", t0 + 5)
    _touch(logs / "worker-bb-02000000-200.err", "torch.OutOfMemoryError: CUDA out of memory.\n", t0 + 20)
    now = [t0 + 30]
    jobs = [[_job("raydrop-old-1", (t0 - 900) * 1000, str(ev1) + "/", end_ms=(t0 - 300) * 1000, status="FAILED"),
             _job("raydrop-a-1", t0 * 1000, str(ev1) + "/")]]
    f = raylogs.Follower(str(logs), "gpu-worker-x7k2p", lambda: jobs[0], linger=60, now=lambda: now[0])
    assert f.sync() == (2, None)
    got = ev1 / "ray" / "gpu-worker-x7k2p"
    assert sorted(p.name for p in got.iterdir()) == [raylogs.INDEX, "raylet.out", "worker-bb-02000000-200.err"]
    assert "CUDA out of memory" in (got / "worker-bb-02000000-200.err").read_text()

    # The job ends; the raylet's account of the workers' exit still comes within linger.
    jobs[0][1] = _job("raydrop-a-1", t0 * 1000, str(ev1) + "/", end_ms=(t0 + 40) * 1000, status="FAILED")
    _touch(logs / "raylet.out", "raylet up\nworker 200 exited: SYSTEM_ERROR\n", t0 + 45)
    now[0] = t0 + 50
    assert f.sync() == (1, None)
    assert (got / "raylet.out").read_text().endswith("SYSTEM_ERROR\n")
    _touch(logs / "raylet.out", "raylet up\nworker 200 exited: SYSTEM_ERROR\nidle\n", t0 + 200)
    now[0] = t0 + 201  # past linger: nothing more goes to that run
    assert f.sync() == (0, None)
    assert (got / "raylet.out").read_text().endswith("SYSTEM_ERROR\n")

    # A job that names no evidence folder (not a raydrop attempt) gets nothing.
    jobs[0].append(_job("someone-elses", (t0 + 300) * 1000))
    now[0] = t0 + 310
    _touch(logs / "worker-cc-03000000-300.out", "their job\n", t0 + 305)
    assert f.sync() == (0, None)
    # The next attempt gets its own folder, from its own start.
    jobs[0].append(_job("raydrop-b-1", (t0 + 400) * 1000, str(ev2)))
    _touch(logs / "worker-dd-04000000-400.out", "rank 0 step 1\n", t0 + 410)
    now[0] = t0 + 420
    assert f.sync() == (1, None)
    assert sorted(p.name for p in (ev2 / "ray" / "gpu-worker-x7k2p").iterdir()) == [raylogs.INDEX, "worker-dd-04000000-400.out"]
    assert not (ev1 / "ray" / "gpu-worker-x7k2p" / "worker-dd-04000000-400.out").exists()


def test_the_follower_goes_on_when_the_head_is_gone(tmp_path):
    """A lost head must not stop the workers' copies: they go on to the last folder, and
    the failure to ask is reported."""
    logs, ev = tmp_path / "logs", tmp_path / "evidence" / "attempt-2"
    logs.mkdir()
    t0 = time.time()
    answers = [[_job("raydrop-a-2", t0 * 1000, str(ev))]]

    def jobs():
        if not answers:
            raise ConnectionRefusedError(111, "Connection refused")
        return answers.pop()

    f = raylogs.Follower(str(logs), "head-abcde", jobs)
    (logs / "raylet.out").write_text("up\n")
    assert f.sync() == (1, None)
    with open(logs / "raylet.out", "a") as out:
        out.write("GCS unreachable\n")
    written, err = f.sync()
    assert written == 1 and "ask the head for its jobs" in err and "Connection refused" in err
    assert (ev / "ray" / "head-abcde" / "raylet.out").read_text() == "up\nGCS unreachable\n"


def test_the_follower_refuses_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="linger -1"):
        raylogs.Follower(str(tmp_path), "pod", list, linger=-1)
    with pytest.raises(ValueError, match="pod 'a/b'"):
        raylogs.Follower(str(tmp_path), "a/b", list)
    proc = subprocess.run([sys.executable, "raylogs.py", "--follow", "http://127.0.0.1:1"],
                          capture_output=True, text=True, cwd=os.path.dirname(raylogs.__file__))
    assert proc.returncode == 2 and "--follow needs --pod" in proc.stderr


def test_the_sidecar_follows_a_head_over_http_and_copies_on_sigterm(tmp_path):
    """The sidecar's command line against an HTTP server answering GET /api/jobs/ as the
    head does; SIGTERM brings the last copy."""
    import http.server

    logs, ev = tmp_path / "logs", tmp_path / "evidence" / "attempt-1"
    logs.mkdir()
    body = json.dumps([_job("raydrop-r-1", (time.time() - 5) * 1000, str(ev) + "/")]).encode()

    class Head(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = self.path == "/api/jobs/"
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body if ok else b"{}")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Head)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (logs / "raylet.out").write_text("raylet up\n")
        proc = subprocess.Popen([sys.executable, "raylogs.py", "--logs", str(logs), "--follow", f"http://127.0.0.1:{server.server_port}",
                                 "--pod", "gpu-worker-abcde", "--every", "3600"],
                                cwd=os.path.dirname(raylogs.__file__), stderr=subprocess.PIPE, text=True)
        got = ev / "ray" / "gpu-worker-abcde"
        _first_copy(proc, got)
        with open(logs / "raylet.out", "a") as f:
            f.write("SIGTERM received\n")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        assert (got / "raylet.out").read_text() == "raylet up\nSIGTERM received\n"
    finally:
        server.shutdown()
