"""`memagent` command line: ask / eval / train / serve / models.

Every error a user can cause ends as one line on stderr and exit code 2 (1 for a failed question), never
a traceback: the CLI catches the library's user-facing error types in one place (`USER_ERRORS`).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from pathlib import Path

MIN_CHUNK_TOKENS = 16


def _user_errors() -> tuple[type[BaseException], ...]:
    from .chunking import DocumentError
    from .models import ModelError
    from .prompts import TemplateError
    from .protocol import BackendError
    from .state import StateError
    from .tokenizer import TokenizerError

    return (DocumentError, ModelError, TemplateError, BackendError, StateError, TokenizerError, ValueError,
            FileNotFoundError, IsADirectoryError, PermissionError)


def add_backend_args(p: argparse.ArgumentParser) -> None:
    """Backend options shared by ask / eval / serve."""
    p.add_argument("--backend", default="embedded", choices=["embedded", "openai", "instant"],
                   help="embedded: offline model from PyPI (default); openai: any OpenAI-compatible server")
    from .models import DEFAULT_MODEL

    p.add_argument("--model", default=None, help=f"embedded: registry name or HF folder (default: {DEFAULT_MODEL}); "
                                                 "openai: served model name (default: the server's first model)")
    p.add_argument("--base-url", action="append", default=None,
                   help="e.g. http://127.0.0.1:8000/v1 (default $OPENAI_BASE_URL); give it several times for a "
                        "pool of replicas: each document stays on one, a dead one's documents move to another")
    p.add_argument("--base-url-file", default=None,
                   help="openai: a file of server URLs, one a line (a pool; default: none)")
    p.add_argument("--api-key", default=None, help="default: $OPENAI_API_KEY (never written to traces or results)")
    p.add_argument("--tokenizer", default=None, help="openai: tokenizer.json, HF folder, .gguf or cl100k_base "
                                                     "(default: cl100k_base, approximate, with a warning)")
    p.add_argument("--threads", type=int, default=None, help="embedded: threads (default: all cores)")
    p.add_argument("--engine", default=None, choices=["torch", "llama.cpp"],
                   help="embedded: runtime; llama.cpp runs the Q4 GGUF as is via xllamacpp (docs/engines.md) "
                        "(default: the model's own, see `memagent models`; torch for HF folders)")
    p.add_argument("--adapter", default=None,
                   help="embedded: a LoRA adapter folder (final/ of memagent sft, rft or train) applied to --model, "
                        "an untrained base; llama.cpp converts it to a GGUF LoRA once (default: none)")
    p.add_argument("--merge-lora", action="store_true",
                   help="embedded, llama.cpp: fold the model's adapter (or --adapter) into a Q8_0 copy of the "
                        "base once (cached; ~625 MB for the 0.5B) instead of applying it per token: ~1.2x faster "
                        "prompt processing, but not bit-for-bit the same replies: a read near a tie can change, as "
                        "the demo's second answer does (docs/engines.md) (default: off)")
    p.add_argument("--concurrency", type=int, default=None,
                   help="openai: requests in flight at most (default 64; eval: samples in flight, default 4 "
                        "embedded, 16 openai)")
    p.add_argument("--timeout", type=float, default=None, help="openai: seconds per request (default 120)")
    p.add_argument("--max-retries", type=int, default=None, help="openai: retries on 5xx/429/timeouts (default 5)")


def add_gate_args(p: argparse.ArgumentParser) -> None:
    """The call-saving gates shared by ask / eval (memagent/gates.py); both off by default."""
    from .gates import EXIT_MODES, SKIP_MODES

    p.add_argument("--skip-update", default="off", choices=SKIP_MODES,
                   help="lexical: no update call for a chunk that mentions none of the question's key terms "
                        "(names, numbers; or content words) nor a name the memory picked up; the memory is kept. "
                        "Fewer calls; can miss evidence phrased without those terms. Off by default")
    p.add_argument("--early-exit", default="off", choices=EXIT_MODES,
                   help="marker: the model may end its memory with the template's exit marker once it holds "
                        "the answer; reading stops there and the answer is asked at once. Off by default")
    p.add_argument("--chunk-snap", type=int, default=0, metavar="N",
                   help="end each chunk at the last line or sentence end within its final N tokens (never past "
                        "--chunk-tokens), so a fact is not cut in half by a boundary. 0 (default): token-exact")


def check_gates(args, template) -> None:
    """Refuse a gate the template cannot serve before any model loads."""
    if getattr(args, "early_exit", "off") == "marker" and template.update_exit is None:
        raise ValueError(f"--early-exit marker needs a template with update_exit and exit_marker; "
                         f"{template.name!r} has none")


def backend_from_args(args):
    """(backend, tokenizer, model spec or None) from parsed args."""
    from . import models
    from .backends import make_backend, resolve_tokenizer

    spec = None
    if args.backend == "embedded":
        name = args.model or models.DEFAULT_MODEL
        spec = models.MODELS.get(name)
        engine = getattr(args, "engine", None) or models.default_engine(name)
        gguf_file = engine == "llama.cpp" and name.endswith(".gguf") and os.path.isfile(name)
        if spec is None and not os.path.isdir(name) and not gguf_file:
            raise models.ModelError(f"unknown model {name!r}; known: {', '.join(models.MODELS)} or an HF folder"
                                    f"{' (or a .gguf file)' if engine == 'llama.cpp' else ''}")
        if args.tokenizer:
            raise ValueError("--tokenizer is for server backends; the embedded model always uses its own tokenizer")
        tokenizer = resolve_tokenizer("embedded", name, name if gguf_file else None)
        kw = {"threads": args.threads} if args.threads else {}
        if getattr(args, "adapter", None):
            kw["adapter"] = args.adapter
        if getattr(args, "merge_lora", False):
            if engine != "llama.cpp":
                raise ValueError("--merge-lora is for --engine llama.cpp (the torch engine merges adapters already)")
            kw["merge_lora"] = True
        backend = make_backend("embedded", model=name, engine=engine, **kw)
    else:
        for flag in ("adapter", "merge_lora"):
            if getattr(args, flag, None):
                raise ValueError(f"--{flag.replace('_', '-')} is for the embedded backend; a server loads its "
                                 f"own adapters")
        tokenizer = resolve_tokenizer(args.backend, args.model, args.tokenizer, warn=print)
        kw = {k: getattr(args, k) for k in ("concurrency", "timeout", "max_retries")
              if getattr(args, k, None) is not None and args.backend == "openai"}
        urls = args.base_url or ([os.environ["OPENAI_BASE_URL"]] if os.environ.get("OPENAI_BASE_URL") else None)
        backend = make_backend(args.backend, model=args.model, base_url=urls, api_key=args.api_key,
                               base_url_file=getattr(args, "base_url_file", None), **kw)
    return backend, tokenizer, spec


def reading_defaults(args, spec) -> tuple[int, int, str]:
    """chunk, memory, template: the original's 5000/1024 for servers, measured values for embedded models."""
    chunk = args.chunk_tokens if args.chunk_tokens is not None else (spec.chunk_tokens if spec else 5000)
    memory = args.memory_tokens if args.memory_tokens is not None else (spec.memory_tokens if spec else 1024)
    template = args.template or (spec.default_template if spec else "memagent")
    if chunk < MIN_CHUNK_TOKENS:
        raise ValueError(f"--chunk-tokens {chunk} is too small; use at least {MIN_CHUNK_TOKENS}")
    if memory <= 0:
        raise ValueError(f"--memory-tokens must be positive, got {memory}")
    return chunk, memory, template


def check_window(agent, spec, questions: list[str]) -> None:
    """Refuse settings whose prompts cannot fit the embedded model's window, before any work."""
    if spec is None:
        return
    t = agent.template
    update = t.update_exit if agent.reader.config.early_exit == "marker" else t.update
    fixed = len(agent.tokenizer.encode(update)) + 32  # chat wrapper
    q = max(len(agent.tokenizer.encode(x)) for x in questions)
    need = fixed + q + agent.chunk_tokens + 2 * agent.reader.config.memory_tokens
    if need > spec.context_window:
        raise ValueError(f"chunk ({agent.chunk_tokens}) + memory ({agent.reader.config.memory_tokens}) + "
                         f"prompt need ~{need} tokens, more than {spec.name}'s window of {spec.context_window}")


def refuse_file_questions(doc: str, questions: list[str]) -> None:
    """`ask` reads one document. `ask a.txt b.txt "Q?"` would otherwise ask "b.txt" as a question and
    never read b.txt, so a question that is the path of an existing file (and has no space) is refused."""
    for q in questions:
        if " " not in q.strip() and os.path.isfile(q.strip()):
            raise ValueError(f"{q!r} is a file, but ask reads one document ({doc}) and takes the rest as "
                             f"questions; run ask once per document")


def cmd_ask(args) -> int:
    from .chunking import open_document
    from .driver import MemoryAgent, check_outputs
    from .prompts import load_template

    from . import checks

    questions = [q for q in args.questions]
    if not questions:
        raise ValueError("give at least one question")
    for q in questions:
        if not q.strip():
            raise ValueError("a question is empty")
    checks.questions(questions)
    checks.cli_numbers(args)
    refuse_file_questions(args.doc, questions)
    if args.api_key is None:
        args.api_key = os.environ.get("OPENAI_API_KEY")
    from . import models

    spec = models.MODELS.get(args.model or models.DEFAULT_MODEL) if args.backend == "embedded" else None
    chunk, memory, template = reading_defaults(args, spec)
    template = load_template(template)  # bad template or document: fail before loading any model
    check_gates(args, template)
    # "-" is stdin here only: the Python API takes any str as text (memagent.chunking.open_document)
    document = open_document(sys.stdin.buffer if args.doc == "-" else Path(args.doc))
    check_outputs(document, args.trace, args.state)  # before a model loads or the estimate is printed
    backend, tokenizer, spec = backend_from_args(args)
    agent = MemoryAgent(backend, tokenizer, template=template, chunk_tokens=chunk, memory_tokens=memory,
                        answer_tokens=args.answer_tokens, temperature=args.temperature, seed=args.seed,
                        skip_update=args.skip_update, early_exit=args.early_exit,
                        chunk_snap=args.chunk_snap)
    check_window(agent, spec, questions)
    from .progress import CallCounter, ReadProgress, estimate_chunks

    # progress in finished model calls, projected from the file's size (memagent/progress.py)
    progress = ReadProgress(len(questions), estimate_chunks(None if args.doc == "-" else args.doc, tokenizer, chunk))
    agent.backend = CallCounter(backend, progress)

    async def run():
        try:
            return await agent.aread(document, questions, trace=args.trace, state=args.state,
                                     progress=progress.chunk_done)
        finally:
            await backend.aclose()

    t0 = time.perf_counter()
    with progress:
        answers = asyncio.run(run())
    failed = 0
    for a in answers:
        for w in a.warnings:
            print(f"memagent: warning: {w}", file=sys.stderr)
        if a.error:
            failed += 1
            print(f"memagent: question failed: {a.question!r}: {a.error}", file=sys.stderr)
        if args.json:
            print(json.dumps(a.to_json(), ensure_ascii=False))
        else:
            print(f"Q: {a.question}\nA: {a.answer if a.answer is not None else '(no answer: ' + str(a.error) + ')'}")
    if not args.json:
        a = answers[0]
        gates = (f", {a.skipped_chunks} skipped" if a.skipped_chunks else "") + \
            (f", stopped after chunk {a.exit_chunk + 1}" if a.exit_chunk is not None else "")
        print(f"({a.chunks} chunks{gates}, {a.doc_tokens} tokens, {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 1 if failed else 0


def cmd_models(args) -> int:
    from . import models

    if args.card:
        try:
            spec = models.get_spec(args.card)
        except models.ModelError as e:
            print(f"memagent models: error: {e}", file=sys.stderr)
            return 2
        if not spec.card:
            print(f"{spec.name}: {spec.description}\n(no model card: an untrained base from PyPI)")
            return 0
        print(models.card_text(spec))
        return 0
    for name, spec in models.MODELS.items():
        try:
            where = str(models.gguf_path(name)) if args.verify else "(not checked; use --verify)"
            if args.verify and spec.adapter:
                where += f"\n  adapter {models.verify_adapter(spec)} (sha256 ok)"
        except models.ModelError as e:
            where = f"not installed: {e}"
        default = " (default)" if name == models.DEFAULT_MODEL else ""
        print(f"{name}{default}: {spec.description}\n  template={spec.default_template} chunk={spec.chunk_tokens} "
              f"memory={spec.memory_tokens} window={spec.context_window} engine={spec.engine}\n  {where}")
    if args.prepare:
        for path in prepare_model(args.prepare):
            print(path)
    return 0


def prepare_model(name: str) -> list:
    """Everything `name` needs on its default engine, built once into the cache (setup.sh calls this):
    the merged HF folder for torch; for llama.cpp the assembled GGUF, its adapter as a GGUF LoRA and the
    tokenizer, so that the first `ask` starts at once."""
    from . import models

    if models.default_engine(name) != "llama.cpp":
        return [models.hf_dir(name)]
    from . import gguf_export

    return [models.gguf_path(name), *gguf_export.adapters_for(name), models.tokenizer_path(name)]


def build_parser() -> argparse.ArgumentParser:
    from .clihelp import Parser, add_unavailable, reading_help, version

    p = Parser(prog="memagent", description="Read documents of any length through a small memory.")
    p.add_argument("--version", action="version", version=f"memagent {version()}")
    sub = p.add_subparsers(dest="command", required=True)

    a = sub.add_parser("ask", help="answer questions about one document (DOC may be '-' for stdin)",
                       description="Read DOC once, chunk by chunk, through a small memory per question, then "
                                   "answer each QUESTION from its memory. Runs the embedded offline model by "
                                   "default; --backend openai --base-url URL uses any OpenAI-compatible server.",
                       epilog="Fewer calls: --skip-update lexical skips chunks without the question's key terms, "
                              "--early-exit marker stops once the model marks its memory as answering; both off "
                              "by default (measured: benchmarks/bench_gates.py, benchmarks/README.md).")
    a.add_argument("doc", help="one document: a text file, or '-' for stdin")
    a.add_argument("questions", nargs="+", metavar="QUESTION",
                   help="one or more questions, answered in one pass; a QUESTION that names an existing file is "
                        "refused (ask reads one document: run it once per document)")
    add_backend_args(a)
    a.add_argument("--chunk-tokens", type=int, default=None, help=f"tokens per chunk ({reading_help('chunk')})")
    a.add_argument("--memory-tokens", type=int, default=None, help=f"memory cap in tokens ({reading_help('memory')})")
    a.add_argument("--answer-tokens", type=int, default=256, help="token limit of the final answer")
    a.add_argument("--template", default=None, help="built-in name (notes, memagent) or a .toml/.json file "
                                                    f"({reading_help('template')})")
    a.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    a.add_argument("--seed", type=int, default=None, help="sampling seed (default: none; greedy needs none)")
    a.add_argument("--trace", default=None, help="append one JSON line per model call to this file (default: none)")
    a.add_argument("--state", default=None, help="save memory after every chunk here; rerun to resume "
                                                 "(default: not saved)")
    a.add_argument("--json", action="store_true", help="one JSON object per question on stdout")
    add_gate_args(a)
    a.set_defaults(func=cmd_ask)

    m = sub.add_parser("models", help="list the embedded models")
    m.add_argument("--verify", action="store_true", help="check installed files and sha256")
    m.add_argument("--prepare", metavar="NAME", help="make NAME ready for its default engine now: an HF folder "
                                                     "(torch) or GGUF + LoRA GGUF (llama.cpp); cached (default: none)")
    m.add_argument("--card", metavar="NAME", help="print NAME's model card: base, data, training stages, "
                                                  "before/after numbers (default: none)")
    m.set_defaults(func=cmd_models)

    for mod, name in (("memagent.eval", "eval"), ("memagent.rl.trainer", "train"), ("memagent.rl.sft", "sft"),
                      ("memagent.rl.rft", "rft"),
                      ("memagent.server.router", "serve")):
        try:
            importlib.import_module(mod).add_parser(sub)
        except (ImportError, AttributeError) as e:  # listed all the same; running it says why
            if name not in sub.choices:
                add_unavailable(sub, name, mod, e)
    return p


def main(argv: list[str] | None = None) -> int:
    from .redact import register, scrub

    args = build_parser().parse_args(argv)
    for key in (getattr(args, "api_key", None), os.environ.get("OPENAI_API_KEY")):
        register(key)  # scrubbed from every line and file this run writes (memagent/redact.py)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt:
        hint = f"; rerun with --state {args.state} to resume" if getattr(args, "state", None) else ""
        print(f"memagent: interrupted{hint}", file=sys.stderr)
        return 130
    except _user_errors() as e:
        if os.environ.get("MEMAGENT_DEBUG"):
            raise
        print(f"memagent: error: {scrub(str(e))}", file=sys.stderr)
        return 2
    except OSError as e:
        if os.environ.get("MEMAGENT_DEBUG"):
            raise
        print(f"memagent: error: {scrub(str(e))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
