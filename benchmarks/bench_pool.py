"""A pool of model servers: throughput of 3 replicas vs 1, and an eval that survives a replica's death.

Setup: `python -m memagent.server --backend instant` processes with a per-call delay and a bounded
number of calls "on the model" at once (`--instant-delay D --instant-slots S`: S/D calls per second per
replica, like a GPU server with S batch slots), so a replica has a finite capacity as a real one does
and the pool's gain is measurable on a laptop. Both parts run the real `memagent eval` command
(`--backend openai --base-url ... --base-url ...`) on a RULER NIAH task.

1. Throughput: the same eval against 1 replica and against 3, alternated `--repeats` times; the median
   ratio of their rates (samples per second).
   The time is the eval's own `wall_seconds_last_run` (summary.json): building the samples overlaps the
   reading in both arms; interpreter start-up is left out.
2. Failover: the 3-replica eval again; once a replica has completed some calls it is SIGKILLed
   (kill -9), then restarted on the same port a moment later. Checked: every sample finished without
   an error, no sample id twice in samples.jsonl, every answer (and the number of calls) equal to the
   undisturbed run, and the restarted replica served calls again.

    python benchmarks/bench_pool.py            # writes benchmarks/results/pool.json
    python benchmarks/bench_pool.py --smoke    # seconds; writes pool.smoke.json
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT, LoopbackServer, median, print_table, write_result


def eval_cmd(urls: list[str], out: Path, a) -> list[str]:
    cmd = [sys.executable, "-m", "memagent", "eval", "--task", a.task, "--lengths", a.length, "--n", str(a.n),
           "--backend", "openai", "--model", "instant", "--tokenizer", "cl100k_base",
           "--chunk-tokens", str(a.chunk_tokens), "--memory-tokens", "128", "--answer-tokens", "32",
           "--concurrency", str(a.concurrency), "--timeout", "10", "--no-plot", "--out", str(out)]
    for u in urls:
        cmd += ["--base-url", u]
    return cmd


def run_eval(urls, out: Path, a, during=None) -> float:
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    t = time.perf_counter()
    proc = subprocess.Popen(eval_cmd(urls, out, a), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if during:
        threading.Thread(target=during, args=(proc,), daemon=True).start()
    stdout, stderr = proc.communicate(timeout=900)
    elapsed = time.perf_counter() - t
    if proc.returncode != 0:
        raise SystemExit(f"eval failed ({proc.returncode}):\n{stderr[-3000:]}")
    # the eval's own clock: from its first sample to its last (process start-up and imports excluded)
    return json.loads((out / "summary.json").read_text())["totals"].get("wall_seconds_last_run", elapsed)


def samples(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines() if line.strip()]


def build_seconds(a) -> float:
    """Time to build the samples alone (the eval does it too, in both arms)."""
    sys.path.insert(0, str(ROOT))
    from memagent.tasks import iter_samples, parse_lengths
    from memagent.tokenizer import load_tokenizer

    t = time.perf_counter()
    n = sum(1 for _ in iter_samples([a.task], parse_lengths(a.length), a.n, load_tokenizer("cl100k_base")))
    assert n == a.n
    return time.perf_counter() - t


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--n", type=int, default=96, help="samples (documents) per eval")
    p.add_argument("--task", default="niah_single_1")
    p.add_argument("--length", default="8k")
    p.add_argument("--chunk-tokens", type=int, default=1000)
    p.add_argument("--concurrency", type=int, default=24, help="documents in flight (eval --concurrency)")
    p.add_argument("--delay", type=float, default=0.05, help="seconds per call on a replica")
    p.add_argument("--slots", type=int, default=2, help="calls a replica serves at once")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args(argv)
    if a.smoke:
        a.n, a.repeats, a.length, a.delay = 12, 1, "4k", 0.02
    server_args = ("--instant-delay", str(a.delay), "--instant-slots", str(a.slots))
    work = Path(tempfile.mkdtemp(prefix="bench-pool-"))
    build = build_seconds(a)
    replicas = [LoopbackServer(*server_args).__enter__() for _ in range(a.replicas)]
    try:
        urls = [r.base_url for r in replicas]
        one, many = [], []
        for i in range(a.repeats):
            one.append(run_eval(urls[:1], work / "one", a))
            many.append(run_eval(urls, work / "pool", a))
            print(f"repeat {i + 1}: 1 replica {one[-1]:.2f} s, {a.replicas} replicas {many[-1]:.2f} s",
                  file=sys.stderr)
        calls = sum(s["calls"] for s in samples(work / "pool"))
        ratios = [o / max(m, 1e-9) for o, m in zip(one, many)]
        undisturbed = {s["id"]: s for s in samples(work / "pool")}

        # ---- failover: kill -9 one replica mid-eval, restart it on the same port
        victim = replicas[1]
        events = {}

        def chaos(proc):
            start, after = victim.health()["completed"], max(5, calls // (4 * a.replicas))
            while victim.health()["completed"] < start + after:
                if proc.poll() is not None:  # the eval ended first: nothing was killed (reported below)
                    events["restarted"] = False
                    return
                time.sleep(0.01)
            victim.proc.kill()  # SIGKILL
            victim.proc.wait()
            events["killed_after_calls_on_it"] = victim_calls = after
            assert victim_calls
            time.sleep(0.5)
            revived = LoopbackServer(*server_args)
            revived.port = victim.port
            replicas[1] = revived.__enter__()
            events["restarted"] = True

        failover_s = run_eval(urls, work / "failover", a, during=chaos)
        # wait for the chaos thread's restart to have happened before reading the revived replica
        deadline = time.monotonic() + 30
        while "restarted" not in events and time.monotonic() < deadline:
            time.sleep(0.05)
        got = samples(work / "failover")
        ids = [s["id"] for s in got]
        revived_calls = replicas[1].health()["completed"]
        failover = {
            "samples": len(got), "expected": a.n, "errors": sum(bool(s["error"]) for s in got),
            "duplicates": len(ids) - len(set(ids)),
            "answers_equal_undisturbed": all(undisturbed[s["id"]]["reply"] == s["reply"] and
                                             undisturbed[s["id"]]["calls"] == s["calls"] for s in got)
                                         and set(ids) == set(undisturbed),
            "calls_equal_undisturbed": sum(s["calls"] for s in got) == calls,
            "restarted_replica_served_calls": revived_calls, "seconds": round(failover_s, 2), **events,
        }
    finally:
        for r in replicas:
            r.__exit__()
        shutil.rmtree(work, ignore_errors=True)
    rate_one = a.n / median(one)
    rate_many = a.n / median(many)
    numbers = {
        "setup": {"replicas": a.replicas, "delay_s": a.delay, "slots_per_replica": a.slots,
                  "capacity_calls_per_s_per_replica": a.slots / a.delay, "task": a.task, "length": a.length,
                  "samples": a.n, "chunk_tokens": a.chunk_tokens, "documents_in_flight": a.concurrency,
                  "calls_per_eval": calls},
        "build_samples_s": round(build, 2),
        "one_replica_s": [round(x, 2) for x in one], "pool_s": [round(x, 2) for x in many],
        "samples_per_s_one": round(rate_one, 2), "samples_per_s_pool": round(rate_many, 2),
        "throughput_ratio": round(median(ratios), 2), "ratios": [round(r, 2) for r in ratios],
        "goal_ratio": 2.7, "failover": failover,
    }
    path = write_result("pool", numbers, smoke=a.smoke)
    print_table([("1 replica", f"{rate_one:.2f}"), (f"{a.replicas} replicas", f"{rate_many:.2f}"),
                 ("ratio", numbers["throughput_ratio"])], ("", "samples/s"))
    print(json.dumps(failover, indent=1))
    print(f"wrote {path}", file=sys.stderr)
    ok = (failover["samples"] == a.n and not failover["errors"] and not failover["duplicates"]
          and failover["answers_equal_undisturbed"] and failover.get("restarted"))
    return numbers if ok else sys.exit("failover check failed: " + json.dumps(failover))


if __name__ == "__main__":
    main()
