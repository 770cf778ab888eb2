"""What serving a read costs: a reading job over HTTP vs the same read through the library (what `ask` runs).

Same backend (instant: no model, so what is measured is our own work), same document, settings and
questions. The library read is run as `ask --state --trace` runs it (state saved and trace written after
every chunk), since a job persists exactly that; the bare library read (no files) is reported too. The
job is timed from POST /api/jobs to its `done` event arriving over the event stream, on a server that
has already loaded its tokenizer. Also measured: how long each chunk event takes from the server
publishing it to this client receiving it (the page reads the same stream).

    python benchmarks/bench_serve.py            # ~1 min; writes benchmarks/results/serve.json
    python benchmarks/bench_serve.py --smoke
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median, write_result  # noqa: E402
from servers import ServerProcess  # noqa: E402

from memagent.backends import resolve_tokenizer  # noqa: E402
from memagent.backends.instant import InstantBackend  # noqa: E402
from memagent.driver import MemoryAgent  # noqa: E402


def post(url: str, body: bytes, ctype="application/json") -> dict:
    r = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": ctype})
    with urllib.request.urlopen(r, timeout=60) as f:
        return json.loads(f.read())


def serve_read(server, doc_id, questions, chunk_tokens) -> tuple[float, list[float]]:
    t0 = time.perf_counter()
    job = post(server.root_url + "/api/jobs", json.dumps({"document": doc_id, "questions": questions,
                                                          "chunk_tokens": chunk_tokens}).encode())
    lags = []
    with urllib.request.urlopen(server.root_url + f"/api/jobs/{job['id']}/events", timeout=600) as stream:
        for line in stream:
            if line.startswith(b"data: "):
                e = json.loads(line[6:])
                if e.get("type") == "chunk":
                    lags.append(1000 * (time.time() - e["time"]))
                elif e.get("type") == "done":
                    return time.perf_counter() - t0, lags
    raise RuntimeError("the event stream ended without a done event")


def library_read(doc, questions, chunk_tokens, delay, files: bool) -> float:
    agent = MemoryAgent(InstantBackend(delay=delay), resolve_tokenizer("instant", None, None), template="memagent",
                        chunk_tokens=chunk_tokens, memory_tokens=1024)
    with tempfile.TemporaryDirectory() as d:
        kw = {"state": Path(d) / "s.json", "trace": Path(d) / "t.jsonl"} if files else {}
        t0 = time.perf_counter()
        asyncio.run(agent.aread(doc, questions, **kw))
        return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    lines = 2000 if args.smoke else 20000
    doc = "\n".join(f"Entry {i}: the keeper trimmed lamp {i % 5}; wind from the {'NESW'[i % 4]}." for i in range(lines))
    questions, chunk_tokens = ["Which lamp?", "Which wind?"], 512
    rows = []
    for delay in (0.0, 0.005):
        with ServerProcess("--backend", "instant", "--instant-delay", str(delay), "--max-jobs", "4") as server:
            doc_id = post(server.root_url + "/api/documents", doc.encode(), "text/plain")["id"]
            serve_read(server, doc_id, questions[:1], 4096)  # warm: the server loads its tokenizer
            library_read(doc[:1000], questions, chunk_tokens, 0.0, False)
            served, lags, lib_files, lib_bare = [], [], [], []
            for _ in range(1 if args.smoke else args.repeats):
                s, lag = serve_read(server, doc_id, questions, chunk_tokens)
                served.append(s)
                lags += lag
                lib_files.append(library_read(doc, questions, chunk_tokens, delay, True))
                lib_bare.append(library_read(doc, questions, chunk_tokens, delay, False))
        row = {"instant_delay_s": delay, "chunks": None, "serve_s": round(median(served), 3),
               "library_with_state_trace_s": round(median(lib_files), 3), "library_bare_s": round(median(lib_bare), 3),
               "event_lag_ms_median": round(median(lags), 2), "event_lag_ms_max": round(max(lags), 2),
               "chunk_events": len(lags) // len(served)}
        row["chunks"] = row["chunk_events"]
        row["ratio_vs_library_with_state_trace"] = round(row["serve_s"] / row["library_with_state_trace_s"], 3)
        row["ratio_vs_library_bare"] = round(row["serve_s"] / row["library_bare_s"], 3)
        rows.append(row)
        print(json.dumps(row))
    write_result("serve", {"doc_lines": lines, "questions": len(questions), "chunk_tokens": chunk_tokens,
                           "rows": rows}, smoke=args.smoke)
    return 0


if __name__ == "__main__":
    sys.exit(main())
