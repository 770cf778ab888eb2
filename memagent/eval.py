"""`memagent eval`: accuracy versus document length, resumable, for the memory agent and a direct baseline.

One run = one method on one model with fixed reading settings, over tasks x lengths x N samples. Every
finished sample is appended to DIR/samples.jsonl at once (a kill loses at most the samples in flight);
a failed sample is written with its error and counted as incorrect and as a failure, never dropped
(MemAgent's own script silently skipped failed calls, which inflates accuracy). Rerunning with the same
DIR skips finished samples, retries failed ones, and tolerates a torn last line. DIR/summary.json holds
the accuracy per task x length (naming the metric), and DIR/accuracy_vs_length.png the curve; `memagent
eval plot DIR1 DIR2 ...` draws several runs on one figure, like Figure 1 of the MemAgent paper.

`--method direct` is the baseline the paper compares against: the whole document in one prompt,
truncated in the middle (head + tail) to fit the model's window, answer asked in \\boxed{}.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import io
import json
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .fileio import Appender, FileError, atomic_write, describe, exclusive
from .models import tokenizer_owner
from .protocol import Backend, GenerationRequest
from .redact import redact_argv, scrub
from .specials import defuse, pattern, special_strings
from .tasks import Sample, format_length, iter_samples, resolve_tasks, tasks
from .tasks.scoring import score
from .tokenizer import Tokenizer
from .where_lost import NotesTrail, attribute, count_outcomes, describe_outcomes

DIRECT_PROMPT = ("Read the document below, then answer the question. Put the final answer inside \\boxed{{}}.\n\n"
                 "Question: {question}\n\n<document>\n{document}\n</document>\n\nQuestion: {question}\n"
                 "Give the final answer inside \\boxed{{}}.")
OMITTED = "\n[... middle of the document omitted ...]\n"
CHAT_OVERHEAD = 64  # tokens a chat template adds around one user message (system line, role markers)
# Tasks that count over the whole document: a skipped chunk is a miscount (see memagent/gates.py)
AGGREGATE_TASKS = frozenset({"cwe", "fwe"})
REPLY_CHARS = 2000  # replies and memories are kept in samples.jsonl up to this many characters
# Settings that must match for a DIR to be resumed (tasks, lengths and N may grow between runs).
IDENTITY = ("method", "backend", "model", "tokenizer", "chunk_tokens", "memory_tokens", "template",
            "template_digest", "answer_tokens", "temperature", "seed", "context_window")


@dataclass
class EvalConfig:
    tasks: list[str]
    lengths: list[int]
    n: int = 128
    method: str = "memagent"  # memagent | direct
    seed: int = 42
    backend: str = "embedded"
    model: str | None = None
    tokenizer: str = ""
    chunk_tokens: int = 5000
    memory_tokens: int = 1024
    template: str = "memagent"
    template_digest: str | None = None  # the template's content: an edited file is another template
    answer_tokens: int = 256
    temperature: float = 0.0
    concurrency: int = 4
    context_window: int | None = None  # direct: the model's window
    skip_update: str = "off"  # memagent: the gates of memagent/gates.py
    early_exit: str = "off"
    adapter: str | None = None  # embedded: a LoRA folder applied to the model (--adapter)
    adapter_digest: str | None = None  # its weights' sha256: retrained in place is another model
    merge_lora: bool = False  # llama.cpp: the adapter folded into Q8_0 weights (--merge-lora), not applied per token
    chunk_snap: int = 0  # memagent: chunks end at a sentence end within this many tokens (chunking.iter_chunks)

    def identity(self) -> dict:
        d = asdict(self)
        keep = {k: d[k] for k in IDENTITY}
        if self.method == "direct":  # reading settings do not apply to a single call
            keep.update(chunk_tokens=None, memory_tokens=None, template=None, template_digest=None)
        else:
            keep["context_window"] = None
            # the gates join the identity only when on, so folders written before they existed still resume
            keep.update({k: d[k] for k in ("skip_update", "early_exit") if d[k] != "off"})
            if self.chunk_snap:  # likewise
                keep["chunk_snap"] = self.chunk_snap
        keep.update({k: d[k] for k in ("adapter", "adapter_digest") if d[k] is not None})  # likewise
        if self.merge_lora:
            keep["merge_lora"] = True
        return keep


# ---- results file -------------------------------------------------------------------------------------

def read_records(path: Path) -> dict[str, dict]:
    """Latest record per sample id; a torn (unterminated or unparsable) last line is ignored."""
    out: dict[str, dict] = {}
    if not path.is_file():
        return out
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # the last line of a killed run
                continue
            raise ValueError(f"{path}: line {i + 1} is not JSON; the file is damaged") from None
        out[rec["id"]] = rec
    return out


def summarize(records: list[dict]) -> list[dict]:
    """One row per (task, length): N, failures, mean of the main metric (accuracy) and of every score."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        groups.setdefault((r["task"], r["length"]), []).append(r)
    rows = []
    for (task, length), rs in sorted(groups.items()):
        keys = sorted({k for r in rs for k in r["scores"]})
        ok = [r for r in rs if not r.get("error")]
        rows.append({
            "task": task, "length": length, "length_label": format_length(length), "metric": rs[0]["metric"],
            "n": len(rs), "failures": len(rs) - len(ok),
            "accuracy": round(100 * sum(r["correct"] for r in rs) / len(rs), 2),
            "accuracy_se": standard_error([r["correct"] for r in rs]),
            "scores": {k: round(100 * sum(r["scores"].get(k, 0.0) for r in rs) / len(rs), 2) for k in keys},
            "mean_doc_tokens": round(sum(r["doc_tokens"] for r in rs) / len(rs)),
            "calls": sum(r["calls"] for r in rs), "prompt_tokens": sum(r["prompt_tokens"] for r in rs),
            "completion_tokens": sum(r["completion_tokens"] for r in rs),
            "seconds": round(sum(r["seconds"] for r in rs), 1),
            "seconds_per_sample": round(sum(r["seconds"] for r in ok) / max(1, len(ok)), 2),
            "skipped_chunks": sum(r.get("skipped_chunks", 0) for r in rs),
            "exits": sum(r.get("exit_chunk") is not None for r in rs),
        })
        outcomes = count_outcomes(rs)
        if outcomes is not None:
            rows[-1]["read_outcomes"] = outcomes  # where the wrong reads lost the gold (memagent/where_lost.py)
    return rows


def machine() -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}
    if "torch" in sys.modules:
        info["torch_threads"] = sys.modules["torch"].get_num_threads()
    return info


def standard_error(values: list[float]) -> float | None:
    """Standard error of the mean, in the accuracy's percentage points (None below two samples): with n
    samples an accuracy is only known to about +-2 of these, which is what the plot's error bars show."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return round(100 * (var / n) ** 0.5, 2)


def served_model(backend, out: Path | None = None) -> str | None:
    """The model name the server reported in its replies (else the one it listed, or the one asked for);
    kept from an earlier summary when this run made no call."""
    name = getattr(backend, "reported_model", None) or getattr(backend, "model", None)
    if isinstance(name, str) and name:
        return name
    try:
        return json.loads((out / "summary.json").read_text()).get("served_model") if out else None
    except (OSError, ValueError, AttributeError):
        return None


def adapter_digest(folder: str | None) -> str | None:
    from .models import _sha256  # the digest the registry pins adapters with

    weights = Path(folder) / "adapter_model.safetensors" if folder else None
    return _sha256(weights)[:16] if weights is not None and weights.is_file() else None


def write_summary(out: Path, cfg: EvalConfig, wall: float | None = None, backend=None) -> dict:
    from .clihelp import version

    records = list(read_records(out / "samples.jsonl").values())
    reported = served_model(backend, out) if cfg.backend != "embedded" else cfg.model
    summary = {
        "what": "accuracy = mean of each task's main metric x 100 (metric named per row); failed samples count "
                "as incorrect and in `failures`",
        "method": cfg.method, "model": cfg.model, "backend": cfg.backend, "served_model": reported,
        "memagent_version": version(),
        "config": asdict(cfg), "results": summarize(records),
        "totals": {"samples": len(records), "failures": sum(1 for r in records if r.get("error")),
                   "calls": sum(r["calls"] for r in records),
                   "prompt_tokens": sum(r["prompt_tokens"] for r in records),
                   "completion_tokens": sum(r["completion_tokens"] for r in records),
                   "sample_seconds": round(sum(r["seconds"] for r in records), 1)},
        "machine": machine(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(redact_argv(sys.argv)),  # --api-key and URL credentials masked
    }
    if wall is not None:
        summary["totals"]["wall_seconds_last_run"] = round(wall, 1)
    atomic_write(out / "summary.json", json.dumps(summary, indent=1, ensure_ascii=False) + "\n", "eval summary")
    return summary


# ---- one sample ---------------------------------------------------------------------------------------

def truncate_middle(text: str, tokenizer: Tokenizer, budget: int) -> tuple[str, bool]:
    """Keep the first and last budget/2 tokens of `text` (the direct baseline's standard cut).

    Only the two ends are tokenized when the text is long (a 3.5M-token document is never encoded whole).
    """
    if budget <= 0:
        raise ValueError("the model's window leaves no room for the document")
    head = budget // 2
    tail = budget - head
    span = budget * 16  # characters that surely hold `budget` tokens at either end
    if len(text) > 2 * span:
        ids, starts = tokenizer.encode_offsets(text[:span])
        ids2, starts2 = tokenizer.encode_offsets(text[-span:])
        if len(ids) > head and len(ids2) > tail:
            return text[:starts[head]] + OMITTED + text[len(text) - span + starts2[len(ids2) - tail]:], True
    ids, starts = tokenizer.encode_offsets(text)
    if len(ids) <= budget:
        return text, False
    return text[:starts[head]] + OMITTED + text[starts[len(ids) - tail]:], True


class Runner:
    def __init__(self, cfg: EvalConfig, backend: Backend, tokenizer: Tokenizer, template=None):
        self.cfg, self.backend, self.tokenizer = cfg, backend, tokenizer
        self.agent = None
        if cfg.method == "memagent":
            from .driver import MemoryAgent

            self.agent = MemoryAgent(backend, tokenizer, template=template or cfg.template,
                                     chunk_tokens=cfg.chunk_tokens, memory_tokens=cfg.memory_tokens,
                                     answer_tokens=cfg.answer_tokens, temperature=cfg.temperature, seed=cfg.seed,
                                     skip_update=cfg.skip_update, early_exit=cfg.early_exit,
                                     chunk_snap=cfg.chunk_snap)
        elif cfg.method == "direct":
            if not cfg.context_window:
                raise ValueError("--method direct needs the model's window: pass --context-window N")
            fixed = len(tokenizer.encode(DIRECT_PROMPT.format(question="", document="") + OMITTED))
            self.specials = pattern(special_strings(tokenizer))
            self.doc_budget = cfg.context_window - cfg.answer_tokens - fixed - CHAT_OVERHEAD
        else:
            raise ValueError(f"unknown method {cfg.method!r}; use memagent or direct")

    async def run(self, s: Sample) -> dict:
        rec = {"id": s.id, "task": s.task, "length": s.length, "index": s.index, "method": self.cfg.method,
               "model": self.cfg.model, "question": s.question, "gold": s.gold, "metric": s.metric,
               "doc_tokens": s.doc_tokens, "calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "error": None}
        t0 = time.perf_counter()
        reply = None
        try:
            if self.agent is not None:
                trail = NotesTrail()  # the notes after each update, to say where a wrong read lost the gold
                a = (await self.agent.aread(io.StringIO(s.document), [s.question], trace=trail))[0]
                reply, rec["error"] = a.reply, a.error
                # after an exit the reader stopped early: doc_tokens stays the document's size (the builder's
                # count), read_tokens says how much of it was read
                rec.update(doc_tokens=(s.doc_tokens if a.exit_chunk is not None else a.doc_tokens) or s.doc_tokens,
                           read_tokens=a.doc_tokens, chunks=a.chunks, calls=a.calls,
                           prompt_tokens=a.prompt_tokens, completion_tokens=a.completion_tokens,
                           capped_updates=a.capped_updates, memory=(a.memory or "")[:REPLY_CHARS],
                           skipped_chunks=a.skipped_chunks, exit_chunk=a.exit_chunk)
            else:
                budget = self.doc_budget - 2 * len(self.tokenizer.encode(s.question))  # it is asked twice
                doc, cut = truncate_middle(s.document, self.tokenizer, budget)
                # control tokens in the document stay text (memagent/specials.py), as on the memagent path
                prompt = DIRECT_PROMPT.format(question=defuse(s.question, self.specials),
                                              document=defuse(doc, self.specials))
                gen = await self.backend.generate(GenerationRequest(
                    messages=[{"role": "user", "content": prompt}], max_tokens=self.cfg.answer_tokens,
                    temperature=self.cfg.temperature, seed=self.cfg.seed))
                reply = gen.text
                rec.update(calls=1, prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens,
                           truncated=cut, kept_doc_tokens=min(s.doc_tokens, budget))
        except Exception as e:  # recorded and counted, never dropped; a rerun retries it
            rec["error"] = scrub(f"{type(e).__name__}: {e}")
        pred, scores = score(s.metric, None if rec["error"] else reply, s.gold)
        rec.update(prediction=pred, reply=(reply or "")[:REPLY_CHARS], scores=scores,
                   correct=scores[s.metric], seconds=round(time.perf_counter() - t0, 3))
        if self.agent is not None:
            rec.update(attribute(trail.notes, s.metric, s.gold, rec["correct"], rec["error"]))
        return rec


# ---- the run ------------------------------------------------------------------------------------------

def _tokenizer_key(path: str | None) -> str | None:
    """What makes two runs' tokenizers the same one: the registered model memagent derived it from (its
    cache path depends on the cache's state), else the file's content, so a moved copy still resumes; a
    file that is gone can only be compared by its path."""
    if not path:
        return path
    owner = tokenizer_owner(path)
    if owner:
        return "model:" + owner
    p = Path(path)
    return "sha256:" + hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else path


def _check_dir(out: Path, cfg: EvalConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    identity = cfg.identity()
    identity["tokenizer_key"] = _tokenizer_key(identity["tokenizer"])  # what it is, beside where it sat
    if path.is_file():
        old = json.loads(path.read_text()).get("identity", {})
        keys = list(identity) + [k for k in old if k not in identity]  # both ways: the gates appear only when on
        if "template_digest" not in old:  # written before the digest was recorded: the name is all we have
            keys.remove("template_digest")
        old_tok = old.get("tokenizer_key") or _tokenizer_key(old.get("tokenizer"))
        diff = [f"{k}: {old.get(k)!r} -> {identity.get(k)!r}" for k in keys
                if k not in ("tokenizer", "tokenizer_key") and old.get(k) != identity.get(k)]
        if old_tok != identity["tokenizer_key"]:
            diff.append(f"tokenizer: {old.get('tokenizer')!r} ({old_tok}) -> {identity['tokenizer']!r} "
                        f"({identity['tokenizer_key']})")
        if diff:
            raise ValueError(f"{out} holds a run with other settings ({'; '.join(diff)}); use another --out")
    atomic_write(path, json.dumps({"identity": identity, "config": asdict(cfg)}, indent=1) + "\n", "eval config")


class _Progress:
    """A rich bar with running accuracy on a terminal; one line per sample otherwise (logs)."""

    def __init__(self, total: int):
        self.total, self.done, self.correct, self.failed = total, 0, 0.0, 0
        self.tty = sys.stderr.isatty()
        self.bar = None
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
                TimeRemainingColumn

            self.bar = Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("acc {task.fields[acc]}  failed {task.fields[failed]}"),
                                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), transient=False)
            self.task = self.bar.add_task("eval", total=total, acc="-", failed=0)

    def __enter__(self):
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        if self.bar:
            self.bar.__exit__(*exc)

    def update(self, rec: dict):
        self.done += 1
        self.correct += rec["correct"]
        self.failed += bool(rec["error"])
        acc = f"{100 * self.correct / self.done:.1f}%"
        if self.bar:
            self.bar.update(self.task, advance=1, acc=acc, failed=self.failed)
        else:
            err = f" error={rec['error'][:80]!r}" if rec["error"] else ""
            print(f"[{self.done}/{self.total}] {rec['id']} {rec['metric']}={rec['correct']:.2f} acc={acc} "
                  f"{rec['seconds']:.1f}s{err}", file=sys.stderr, flush=True)


async def arun_eval(out: str | Path, cfg: EvalConfig, backend: Backend, tokenizer: Tokenizer, template=None,
                    plot_png: bool = True) -> dict:
    """Run (or resume) an evaluation into `out`; returns the summary written to out/summary.json."""
    out = Path(out)
    resolve_tasks(",".join(cfg.tasks))
    runner = Runner(cfg, backend, tokenizer, template)  # every setting is checked before config.json is written
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FileError(f"cannot create --out folder {out}: {describe(e)}") from None
    with exclusive(out, "eval folder"):  # a second process on one folder is refused, not interleaved
        return await _run_locked(out, cfg, runner, tokenizer, plot_png)


async def _run_locked(out: Path, cfg: EvalConfig, runner: "Runner", tokenizer: Tokenizer, plot_png: bool) -> dict:
    _check_dir(out, cfg)
    path = out / "samples.jsonl"
    done = {i for i, r in read_records(path).items() if not r.get("error")}
    wanted = {f"{t}/{L}/{i}" for t in cfg.tasks for L in cfg.lengths for i in range(cfg.n)}
    total = len(wanted - done)
    samples = iter_samples(cfg.tasks, cfg.lengths, cfg.n, tokenizer, cfg.seed, skip=done.__contains__)
    build_lock = asyncio.Lock()
    t0 = time.perf_counter()

    samples_file = Appender(path, "eval samples file")  # cuts a torn last line; write errors name the file
    with contextlib.closing(samples_file), _Progress(total) as progress:
        async def worker():
            while True:
                async with build_lock:  # builders keep caches: one build at a time, off the event loop
                    s = await asyncio.to_thread(next, samples, None)
                if s is None:
                    return
                rec = await runner.run(s)
                samples_file.write_line(json.dumps(rec, ensure_ascii=False))
                progress.update(rec)

        try:
            await asyncio.gather(*(worker() for _ in range(max(1, cfg.concurrency))))
        finally:
            summary = write_summary(out, cfg, time.perf_counter() - t0, runner.backend)
    if plot_png and summary["results"]:
        try:
            from .evalplot import plot

            plot([out], out / "accuracy_vs_length.png")
        except ImportError:
            print("memagent: matplotlib is not installed; skipped the plot", file=sys.stderr)
    return summary


# ---- command line -------------------------------------------------------------------------------------

def add_parser(subparsers) -> None:
    """Register `memagent eval` (run / resume), `memagent eval plot` and `memagent eval tasks`."""
    from .cli import add_backend_args
    from .clihelp import reading_help

    p = subparsers.add_parser(
        "eval", help="accuracy vs document length (RULER-HotpotQA, RULER); resumable",
        description="Run a benchmark into --out DIR (rerun the same command to resume). Also: "
                    "`memagent eval plot DIR... -o fig.png`, `memagent eval tasks`.")
    p.add_argument("--task", default="ruler-hotpotqa",
                   help="task names or groups, comma separated (see `memagent eval tasks`)")
    p.add_argument("--lengths", default="7k,14k,28k",
                   help="document lengths in tokens, e.g. 7k,28k,1.75m. A power of two before k counts in "
                        "1024s as RULER writes them (4k = 4096, 128k = 131072), any other k in 1000s as "
                        "MemAgent's table does (7k = 7000); exact numbers are exact")
    p.add_argument("--n", type=int, default=128, help="samples per task and length (the same ones at every length)")
    p.add_argument("--method", default="memagent", choices=["memagent", "direct"],
                   help="memagent: read through the memory; direct: whole document in one prompt (middle cut)")
    add_backend_args(p)
    p.add_argument("--chunk-tokens", type=int, default=None, help=f"tokens per chunk ({reading_help('chunk')})")
    p.add_argument("--memory-tokens", type=int, default=None,
                   help=f"memory cap in tokens ({reading_help('memory')})")
    p.add_argument("--template", default=None, help="built-in name (notes, memagent) or a .toml/.json file "
                                                    f"({reading_help('template')})")
    p.add_argument("--answer-tokens", type=int, default=256, help="token limit of each answer")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    p.add_argument("--context-window", type=int, default=None,
                   help="direct: the model's window in tokens (default: known for embedded models, else "
                        "required)")
    p.add_argument("--seed", type=int, default=42, help="data seed (and sampling seed)")
    p.add_argument("--out", default=None, help="results folder (no default: required to run)")
    p.add_argument("--export", default=None, metavar="FILE",
                   help="only build the samples and write them as JSONL (no model is run; default: off)")
    p.add_argument("--no-plot", action="store_true", help="do not draw accuracy_vs_length.png")
    from .cli import add_gate_args

    add_gate_args(p)
    sub = p.add_subparsers(dest="eval_command")
    pl = sub.add_parser("plot", help="draw several eval folders on one accuracy-vs-length figure")
    pl.add_argument("dirs", nargs="+", metavar="DIR")
    pl.add_argument("-o", "--output", default="accuracy_vs_length.png", help="the PNG to write")
    pl.add_argument("--title", default=None, help="figure title (default: none)")
    sub.add_parser("tasks", help="list the tasks and their metrics")
    p.set_defaults(func=main)


def _list_tasks() -> int:
    from .tasks import GROUPS

    for name, spec in tasks().items():
        print(f"{name:16} {spec.metric:18} {spec.description}")
    for g, names in GROUPS.items():
        print(f"group {g}: {','.join(names)}")
    return 0


def main(args) -> int:
    from .tasks import export_jsonl, parse_lengths

    if getattr(args, "eval_command", None) == "plot":
        from .evalplot import plot

        print(plot(args.dirs, args.output, args.title))
        return 0
    if getattr(args, "eval_command", None) == "tasks":
        return _list_tasks()
    names = resolve_tasks(args.task)
    lengths = parse_lengths(args.lengths)
    from .checks import cli_numbers

    cli_numbers(args)  # --n, --temperature nan, --threads -3 ...: before anything is built or written
    from . import models
    from .backends import resolve_tokenizer

    if args.export:
        tok = resolve_tokenizer(args.backend, args.model, args.tokenizer, warn=print)
        n = export_jsonl(iter_samples(names, lengths, args.n, tok, args.seed), args.export)
        print(f"wrote {n} samples to {args.export}", file=sys.stderr)
        return 0
    if not args.out:
        raise ValueError("give --out DIR for the results (or --export FILE to only build samples)")
    from .cli import backend_from_args, check_gates, reading_defaults
    from .prompts import load_template

    if args.api_key is None:
        args.api_key = os.environ.get("OPENAI_API_KEY")
    spec = models.MODELS.get(args.model or models.DEFAULT_MODEL) if args.backend == "embedded" else None
    chunk, memory, template = reading_defaults(args, spec)
    tmpl = load_template(template)  # a bad template fails before any model loads
    check_gates(args, tmpl)
    if args.method == "direct" and (args.skip_update != "off" or args.early_exit != "off"):
        raise ValueError("--skip-update and --early-exit apply to --method memagent (direct makes one call)")
    if args.method == "direct" and args.chunk_snap:
        raise ValueError("--chunk-snap applies to --method memagent (direct reads no chunks)")
    if args.skip_update != "off" and set(names) & AGGREGATE_TASKS:
        print(f"memagent: warning: --skip-update {args.skip_update} skips chunks an aggregation task "
              f"({', '.join(sorted(set(names) & AGGREGATE_TASKS))}) needs to count", file=sys.stderr)
    backend, tokenizer, spec = backend_from_args(args)
    window = args.context_window or getattr(backend, "context_window", None) or (spec.context_window if spec else None)
    if spec is not None:  # never more than the registry's tested window (the HF config may claim more)
        window = min(window or spec.context_window, spec.context_window)
    cfg = EvalConfig(tasks=names, lengths=lengths, n=args.n, method=args.method, seed=args.seed,
                     backend=args.backend, model=args.model or (models.DEFAULT_MODEL if spec else None),
                     tokenizer=getattr(tokenizer, "name", ""), chunk_tokens=chunk, memory_tokens=memory,
                     template=template, template_digest=tmpl.digest, answer_tokens=args.answer_tokens,
                     temperature=args.temperature,
                     concurrency=args.concurrency or (4 if args.backend == "embedded" else 16),
                     context_window=window if args.method == "direct" else None,
                     skip_update=args.skip_update, early_exit=args.early_exit,
                     adapter=args.adapter, adapter_digest=adapter_digest(args.adapter),
                     merge_lora=bool(getattr(args, "merge_lora", False)), chunk_snap=args.chunk_snap)
    if args.method == "memagent" and spec is not None:
        from .cli import check_window
        from .driver import MemoryAgent

        check_window(MemoryAgent(backend, tokenizer, template=tmpl, chunk_tokens=chunk, memory_tokens=memory,
                                 early_exit=args.early_exit, chunk_snap=args.chunk_snap), spec, ["x" * 200])

    async def go():
        try:
            return await arun_eval(args.out, cfg, backend, tokenizer, tmpl, plot_png=not args.no_plot)
        finally:
            await backend.aclose()

    summary = asyncio.run(go())
    for r in summary["results"]:
        se = f" ± {r['accuracy_se']:.2f}" if r.get("accuracy_se") is not None else ""
        print(f"{r['task']:16} {r['length_label']:>6}  {r['metric']} {r['accuracy']:6.2f}{se}  n={r['n']} "
              f"failures={r['failures']}  {r['seconds_per_sample']}s/sample  "
              f"{describe_outcomes(r.get('read_outcomes'))}")
    print(f"results: {Path(args.out) / 'summary.json'}", file=sys.stderr)
    return 1 if summary["totals"]["failures"] else 0
