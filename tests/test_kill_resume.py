"""SIGKILL in the middle of real work, then a rerun: nothing lost, nothing done twice.

A real server process (the instant backend, with a small delay so there is a "middle" to kill in) counts
the requests it receives, so "no finished chunk is sent again" is checked from the server's side.
The instant backend's memory is a checksum of the whole prompt, so equal final memories prove that the
resumed run followed exactly the same chain of memories as an uninterrupted one.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from servers import ROOT, servers  # noqa: F401  (fixture)


def cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    return [sys.executable, "-m", "memagent", *args], env


def ask_args(doc, server, state):
    return ["ask", str(doc), "What happened?", "--backend", "openai", "--base-url", server.base_url,
            "--model", "instant", "--tokenizer", "cl100k_base", "--chunk-tokens", "100", "--state", str(state), "--json"]


def test_ask_sigkill_then_resume(tmp_path, servers):
    server = servers("--backend", "instant", "--instant-delay", "0.05")
    doc = tmp_path / "doc.txt"
    doc.write_text("".join(f"Line {i}: the tide rose and fell again. " for i in range(600)))

    # uninterrupted reference run
    cmd, env = cli(*ask_args(doc, server, tmp_path / "ref.state"))
    ref = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True).stdout)
    n_chunks = ref["chunks"]
    assert n_chunks >= 20

    state = tmp_path / "run.state"
    cmd, env = cli(*ask_args(doc, server, state))
    before = server.health()["requests"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    done = 0
    while time.time() < deadline and done < n_chunks // 3:
        time.sleep(0.05)
        try:
            done = json.loads(state.read_text())["body"]["chunks_done"]
        except (FileNotFoundError, ValueError, KeyError):
            pass
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    # the state on disk is whole (atomic writes) and says how far the run got
    done = json.loads(state.read_text())["body"]["chunks_done"]
    assert 0 < done < n_chunks
    time.sleep(0.3)  # let a request that was in flight at the kill reach the server's counter
    mid = server.health()["requests"]

    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    after = server.health()["requests"]
    assert after - mid == (n_chunks - done) + 1  # only unfinished chunks + the final answer
    assert mid - before <= done + 1  # the killed run sent at most one request beyond its last saved chunk
    for key in ("answer", "memory", "chunks", "doc_tokens"):
        assert got[key] == ref[key], key


def test_eval_sigkill_then_resume(tmp_path, servers):
    """Kill `memagent eval` mid-run; the rerun completes with no duplicate and no missing sample."""
    server = servers("--backend", "instant", "--instant-delay", "0.02")
    out_dir = tmp_path / "run"
    args = ["eval", "--task", "niah_single_1", "--lengths", "2k", "--n", "12", "--method", "memagent",
            "--backend", "openai", "--base-url", server.base_url, "--model", "instant", "--tokenizer", "cl100k_base",
            "--chunk-tokens", "200", "--memory-tokens", "64", "--concurrency", "2", "--out", str(out_dir)]
    cmd, env = cli(*args)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = out_dir / "samples.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        time.sleep(0.05)
        if samples.exists() and len(samples.read_text().splitlines()) >= 4:
            break
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    partial = len([x for x in samples.read_text().splitlines() if x.strip()])
    assert 0 < partial < 12
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr  # 1 would mean some sample failed (recorded); none should
    rows = [json.loads(x) for x in samples.read_text().splitlines() if x.strip()]
    ids = [x["id"] for x in rows]
    assert len(set(ids)) == 12 and len(ids) == 12, ids
    summary = json.loads((out_dir / "summary.json").read_text())
    assert all(x.get("error") is None for x in rows)
    assert summary["totals"]["samples"] == 12 and summary["totals"]["failures"] == 0


def test_server_killed_and_restarted_mid_run(tmp_path, servers):
    """The server dies mid-document and comes back on the same port: retries carry the run through to
    the same final memory and answer as an uninterrupted run."""
    from servers import ServerProcess

    server = servers("--backend", "instant", "--instant-delay", "0.05")
    doc = tmp_path / "doc.txt"
    doc.write_text("".join(f"Entry {i}: the ferry left on time. " for i in range(500)))
    cmd, env = cli(*ask_args(doc, server, tmp_path / "ref.state"))
    ref = json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=True).stdout)

    state = tmp_path / "run.state"
    cmd, env = cli(*ask_args(doc, server, state), "--max-retries", "10", "--timeout", "5")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline:
        time.sleep(0.05)
        try:
            if json.loads(state.read_text())["body"]["chunks_done"] >= 5:
                break
        except (FileNotFoundError, ValueError, KeyError):
            pass
    server.stop()  # SIGKILL the server mid-run
    time.sleep(1.0)
    again = ServerProcess("--backend", "instant", "--instant-delay", "0.05", port=server.port).start()
    try:
        out, err = p.communicate(timeout=120)
    finally:
        again.stop()
        again.cleanup()
    assert p.returncode == 0, err
    got = json.loads(out)
    for key in ("answer", "memory", "chunks", "doc_tokens"):
        assert got[key] == ref[key], key


def test_train_sigkill_then_resume(tmp_path):
    """`memagent train` SIGKILLed between checkpoints resumes to the same weights as an uninterrupted run."""
    import torch
    from safetensors.torch import load_file

    from memagent.rl.tiny import build_model, build_tokenizer

    folder = tmp_path / "model"
    build_tokenizer(folder)
    build_model(seed=0).save_pretrained(str(folder))
    template = tmp_path / "tiny.toml"
    template.write_text('update = "{question}|{memory}|{chunk}>"\nfinal = "{question}|{memory}>"\nempty_memory = "-"\n')

    def config(out):
        cfg = tmp_path / f"{out}.toml"
        cfg.write_text(f'model = "{folder}"\ntask = "charkv"\nnum_chunks = 2\ntemplate = "{template}"\n'
                       f'memory_tokens = 3\nanswer_tokens = 2\nquestions_per_step = 2\nnum_generations = 4\n'
                       f'beta = 0.0\nwarmup_steps = 0\nlearning_rate = 1e-3\ndevice = "cpu"\ntorch_threads = 1\n'
                       f'save_steps = 1\nmax_steps = 5\nprogress = false\noutput_dir = "{tmp_path / out}"\n')
        return cli("train", "--config", str(cfg))

    cmd, env = config("straight")
    subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=True)

    cmd, env = config("killed")
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = tmp_path / "killed" / "checkpoint" / "trainer_state.json"
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
        try:
            if json.loads(state.read_text())["step"] >= 2:
                break
        except (FileNotFoundError, ValueError, KeyError):
            pass
    assert p.poll() is None, "training finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    killed_at = json.loads(state.read_text())["step"]
    assert 2 <= killed_at < 5
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "resumed from" in r.stderr, r.stderr

    def weights(out):
        files = sorted((tmp_path / out / "final").glob("*.safetensors"))
        assert files
        merged = {}
        for f in files:
            merged.update(load_file(str(f)))
        return merged

    a, b = weights("straight"), weights("killed")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6)
