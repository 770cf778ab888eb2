"""Questions about your own documents, scored: the check that no generator or benchmark wording can game.

Why this exists: every trained round here is chosen on RULER cells and generated documents, and each can
be learned in its own wording. A few documents written by hand, kept out of the repo and read by no
training config, say whether a model learned to keep the asked fact or the look of a benchmark. The
documents stay out of the repo on purpose (a document that is committed is one a later round can be tuned
on), so this script is what is kept: point it at a folder, run it once per model, compare.

    python benchmarks/heldout_docs.py DIR --label r16                       # the embedded default
    python benchmarks/heldout_docs.py DIR --label base -- --model qwen2.5-coder-0.5b --engine llama.cpp

DIR holds the documents and `questions.tsv`, one question a line: `doc<TAB>question<TAB>gold[|gold...]`
(`#` starts a comment). A document's questions are asked in one `memagent ask --json` pass, exactly as a
user runs it; anything after `--` goes to `ask`. Right = the training reward's sub_em: some gold is
contained in the answer after SQuAD normalisation (case, punctuation, articles), so "2,434 pounds"
matches 2434 and "minus 41" does not match -41: write each accepted form as its own gold. Rows are
appended to DIR/results-LABEL.jsonl as each document finishes (with the final notes, to read why a miss
missed), then DIR/summary-LABEL.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, write_result  # noqa: E402

from memagent.rl.rollout import score  # noqa: E402  (the training reward's sub_em: one rule everywhere)


def load_questions(folder: Path) -> "OrderedDict[str, list[tuple[str, list[str]]]]":
    """doc -> [(question, golds)], in file order; a clear error for every malformed line."""
    path = folder / "questions.tsv"
    if not path.is_file():
        raise SystemExit(f"heldout_docs: {path} not found (one line per question: doc<TAB>question<TAB>gold)")
    docs: OrderedDict[str, list] = OrderedDict()
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 3 or not all(p.strip() for p in parts):
            raise SystemExit(f"heldout_docs: {path}:{n}: expected doc<TAB>question<TAB>gold, got {line!r}")
        doc, question, gold = (p.strip() for p in parts)
        if not (folder / doc).is_file():
            raise SystemExit(f"heldout_docs: {path}:{n}: document {doc!r} not found in {folder}")
        golds = [g.strip() for g in gold.split("|") if g.strip()]
        docs.setdefault(doc, []).append((question, golds))
    if not docs:
        raise SystemExit(f"heldout_docs: {path} holds no questions")
    return docs


def ask(doc: Path, questions: list[str], ask_args: list[str], timeout: float) -> tuple[list[dict], str | None]:
    """One `memagent ask --json` pass; (one reply dict per question, error). A failed pass is recorded."""
    cmd = [sys.executable, "-m", "memagent", "ask", "--json", *ask_args, str(doc), *questions]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return [], f"timed out after {timeout:.0f} s"
    replies = []
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                replies.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    error = None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
    return replies, error


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", help="documents + questions.tsv")
    ap.add_argument("--label", required=True, help="names the results files, e.g. the model")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per document (default: 1800)")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: options for memagent ask
    args, ask_args = ap.parse_args(argv[:cut]), argv[cut + 1:]
    folder = Path(args.folder).resolve()
    docs = load_questions(folder)
    rows_path = folder / f"results-{args.label}.jsonl"
    rows_path.write_text("")

    from rich.progress import Progress

    right = total = failed = 0
    seconds = []
    with Progress(transient=True) as bar:
        task = bar.add_task(f"held-out ({args.label})", total=len(docs))
        for doc, qs in docs.items():
            t0 = time.perf_counter()
            replies, error = ask(folder / doc, [q for q, _ in qs], ask_args, args.timeout)
            seconds.append(time.perf_counter() - t0)
            with rows_path.open("a", encoding="utf-8") as f:
                for i, (q, golds) in enumerate(qs):
                    r = replies[i] if i < len(replies) else {}
                    err = r.get("error") or (None if r else error or "no reply")
                    ok = err is None and score(r.get("answer") or "", golds)
                    right, total, failed = right + ok, total + 1, failed + (err is not None)
                    f.write(json.dumps({"doc": doc, "question": q, "golds": golds, "answer": r.get("answer"),
                                        "right": ok, "error": err, "memory": r.get("memory"),
                                        "seconds_for_doc": round(seconds[-1], 1)}, ensure_ascii=False) + "\n")
                    bar.console.print(f"{'right' if ok else 'MISS '} {doc}: {q!r} -> {r.get('answer')!r}"
                                      + (f" [error: {err}]" if err else ""))
            bar.advance(task)
    per_doc = round(sum(seconds) / len(seconds), 1)
    write_result("heldout_docs", {"label": args.label, "ask_args": ask_args, "documents": len(docs),
                                  "questions": total, "right": right, "failed": failed,
                                  "seconds_per_document": per_doc}, path=folder / f"summary-{args.label}.json")
    print(f"{args.label}: {right}/{total} right ({failed} failed), {per_doc} s a document")
    return 0


if __name__ == "__main__":
    sys.exit(main())
