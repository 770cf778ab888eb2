"""FSDP (fsdp = true) under torchrun with two CPU ranks (gloo) on the tiny character model.

One chain checks both claims: the FSDP run trains one step, saves its checkpoint, stops; a second
torchrun launch resumes from it and trains the second step. Its weights, checkpoint and per-step losses
must equal a single process that trained both steps without stopping (the loss is normalised by global
counts, and the reduce-scatter sums gradients, so the maths is the same).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = """import sys, torch
torch.set_num_threads(1)
from memagent.rl.tiny import run_tiny
run_tiny(sys.argv[1], int(sys.argv[2]), questions_per_step=4, num_generations=4, dynamic_sampling=False,
         save_steps=1, fsdp=sys.argv[3] == "1")
"""


def _env():
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    return env


def _losses(folder: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()]


def test_fsdp_two_ranks_match_one_process_and_resume(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    single, sharded = tmp_path / "single", tmp_path / "fsdp"
    single.mkdir()
    sharded.mkdir()
    subprocess.run([sys.executable, str(script), str(single), "2", "0"], env=_env(), check=True, timeout=300)
    logs = []
    for _ in range(2):  # step 1, stop; resume from the checkpoint, step 2
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                            str(script), str(sharded), "1", "1"], env=_env(), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        logs.append(r.stderr)
    assert "resumed from" in logs[1] and "at step 1" in logs[1]
    one, two = torch.load(single / "params-0.pt"), torch.load(sharded / "params-0.pt")
    assert set(one) == set(two)
    diff = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert diff < 1e-4, diff
    from memagent.rl.tiny import build_model

    start = build_model(seed=0).state_dict()
    assert max(float((one[k] - start[k]).abs().max()) for k in one) > 100 * diff  # it did train
    # the checkpoint holds full tensors in the single-process format
    w1 = torch.load(single / "run" / "checkpoint" / "weights.pt")
    w2 = torch.load(sharded / "run" / "checkpoint" / "weights.pt")
    assert set(w1) == set(w2) and all(type(w2[k]) is torch.Tensor and w2[k].shape == w1[k].shape for k in w1)
    assert json.loads((sharded / "run" / "checkpoint" / "trainer_state.json").read_text())["step"] == 2
    l1, l2 = _losses(single), _losses(sharded)
    assert len(l1) == len(l2) == 2
    assert all(abs(a - b) < 1e-6 for a, b in zip(l1, l2)), (l1, l2)
