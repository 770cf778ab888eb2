"""The driver: capped overwrite, many questions in one pass, failures recorded, trace and resume."""
import asyncio
import json
import re

import pytest

from memagent import MemoryAgent
from memagent.backends.scripted import ScriptedBackend
from memagent.protocol import Generation
from memagent.reader import Reader, ReaderConfig
from memagent.prompts import load_template
from memagent.state import StateError

FILLER = "The weather was calm and the sea was grey. "


def doc_with(fact: str, before: int = 150, after: int = 250) -> str:
    return FILLER * before + fact + " " + FILLER * after


class CountingTokenizer:
    """Wraps a tokenizer and counts how much text it was asked to encode."""

    def __init__(self, inner):
        self.inner, self.name, self.chars = inner, inner.name, 0

    def encode_offsets(self, text):
        self.chars += len(text)
        return self.inner.encode_offsets(text)

    def encode(self, text):
        return self.encode_offsets(text)[0]

    def decode(self, ids):
        return self.inner.decode(ids)

    def safe_cut(self, text, before):
        return self.inner.safe_cut(text, before)


def test_planted_fact_found(smol_tokenizer):
    agent = MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128, memory_tokens=64)
    a = agent.ask(doc_with("The secret code is 73412."), "What is the secret code?")
    assert a.answer == "73412" and a.error is None
    assert a.chunks > 10 and a.calls == a.chunks + 1 and a.doc_tokens == len(smol_tokenizer.encode(
        doc_with("The secret code is 73412.")))


def test_memory_is_replaced_and_capped(smol_tokenizer):
    """The reply replaces the memory; a backend that overshoots is cut at memory_tokens."""
    long_reply = "word " * 500
    backend = ScriptedBackend(policy=lambda r: long_reply)
    reader = Reader(load_template("notes"), smol_tokenizer, ReaderConfig(memory_tokens=32))
    s = reader.start("q?")
    s = reader.apply_update(s, Generation(text=long_reply, finish_reason="stop"))
    assert len(smol_tokenizer.encode(s.memory)) <= 32 and s.capped_updates == 1
    s = reader.apply_update(s, Generation(text="fresh", finish_reason="stop"))
    assert s.memory == "fresh" and s.chunks_read == 2 and s.capped_updates == 1
    s = reader.apply_update(s, Generation(text="  ", finish_reason="stop"))
    assert s.memory == reader.template.empty_memory  # empty reply -> explicit empty marker
    agent = MemoryAgent(backend, smol_tokenizer, template="notes", chunk_tokens=64, memory_tokens=32)
    a = agent.ask(FILLER * 30, "q?")
    assert a.capped_updates == a.chunks
    # the generation limit is the memory cap too
    assert all(r.max_tokens == 32 for r in backend.requests[:-1])


def test_many_questions_read_document_once(smol_tokenizer):
    tok = CountingTokenizer(smol_tokenizer)
    doc = doc_with("The secret code is 555.")
    agent = MemoryAgent(ScriptedBackend(), tok, template="notes", chunk_tokens=100, memory_tokens=64)
    answers = agent.ask_questions(doc, ["What is the secret code?", "Which secret code?", "Secret code again?"])
    assert [a.answer for a in answers] == ["555"] * 3
    # the document was tokenized once; the rest is memory-cap counting on short replies
    doc_chars = len(doc)
    assert doc_chars <= tok.chars < doc_chars + 200 * answers[0].chunks * 3


def test_failed_question_recorded_others_continue(smol_tokenizer):
    def fail(n, req):
        return "Question B" in req.messages[-1]["content"] and n > 3

    agent = MemoryAgent(ScriptedBackend(fail_on=fail), smol_tokenizer, template="notes", chunk_tokens=100)
    a, b = agent.ask_questions(doc_with("The secret code is 9."), ["Question A: secret code?", "Question B: code?"])
    assert a.answer == "9" and a.error is None
    assert b.answer is None and "scripted failure" in b.error


def test_many_documents_concurrently(smol_tokenizer):
    backend = ScriptedBackend(delay=0.01)
    agent = MemoryAgent(backend, smol_tokenizer, template="notes", chunk_tokens=200)
    items = [(doc_with(f"The secret code is {i}."), ["What is the secret code?"]) for i in range(8)]
    import time

    t = time.perf_counter()
    finished = []
    out = agent.ask_many(items, concurrency=8, done=lambda: finished.append(time.perf_counter()))
    dt = time.perf_counter() - t
    assert [o[0].answer for o in out] == [str(i) for i in range(8)]
    assert len(finished) == 8  # the progress hook fires once per document
    calls_per_doc = out[0][0].calls
    assert dt < 0.01 * calls_per_doc * 8 * 0.6  # ran concurrently, not one document after another


def test_trace_lines(tmp_path, smol_tokenizer):
    trace = tmp_path / "t.jsonl"
    agent = MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128, memory_tokens=64)
    a = agent.ask(doc_with("The secret code is 1."), "What is the secret code?", trace=trace)
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    assert len(lines) == a.calls
    ups = [x for x in lines if x["step"] == "update"]
    assert [x["chunk"] for x in ups] == list(range(a.chunks))
    assert {"chunk_tokens", "prompt_tokens", "completion_tokens", "memory", "seconds"} <= set(ups[0])
    assert lines[-1]["step"] == "final" and lines[-1]["answer"] == "1"


class Stop(Exception):
    pass


def test_resume_after_interrupt(tmp_path, smol_tokenizer):
    doc = doc_with("The secret code is 31337.", before=100, after=200)
    full = ScriptedBackend()
    agent = MemoryAgent(full, smol_tokenizer, template="notes", chunk_tokens=128)
    want = agent.ask(doc, "What is the secret code?")

    state = tmp_path / "s.json"

    def stop_after_6(chunk, _):
        if chunk.index == 5:
            raise Stop

    first = ScriptedBackend()
    with pytest.raises(Stop):
        asyncio.run(MemoryAgent(first, smol_tokenizer, template="notes", chunk_tokens=128).aread(
            doc, ["What is the secret code?"], state=state, progress=stop_after_6))
    assert len(first.requests) == 6
    second = ScriptedBackend()
    got = MemoryAgent(second, smol_tokenizer, template="notes", chunk_tokens=128).ask(
        doc, "What is the secret code?", state=state)
    assert len(second.requests) == want.calls - 6  # no finished chunk is sent again
    assert (got.answer, got.memory, got.chunks, got.doc_tokens) == (want.answer, want.memory, want.chunks, want.doc_tokens)
    # a finished run is answered from the state file with no call at all
    third = ScriptedBackend()
    again = MemoryAgent(third, smol_tokenizer, template="notes", chunk_tokens=128).ask(
        doc, "What is the secret code?", state=state)
    assert again.answer == want.answer and third.requests == []


def test_state_mismatch_and_damage(tmp_path, smol_tokenizer):
    state = tmp_path / "s.json"
    doc = doc_with("The secret code is 2.")
    MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128).ask(doc, "Q1 secret?", state=state)
    with pytest.raises(StateError, match="other questions"):
        MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128).ask(doc, "Q2?", state=state)
    with pytest.raises(StateError, match="other settings"):
        MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=64).ask(doc, "Q1 secret?", state=state)
    state.write_text(state.read_text()[:-20])
    with pytest.raises(StateError, match="damaged"):
        MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128).ask(doc, "Q1 secret?", state=state)


def test_empty_question_rejected(smol_tokenizer):
    agent = MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128)
    with pytest.raises(ValueError, match="empty"):
        agent.ask("some text", "   ")


def test_tokenizer_mismatch_warning(smol_tokenizer):
    """A backend whose prompt-token count cannot hold our chunk means our tokenizer is not the model's."""

    class Liar(ScriptedBackend):
        async def generate(self, request):
            g = await super().generate(request)
            g.prompt_tokens = 10  # the "server" saw a 10-token prompt for a 300-token chunk
            return g

    agent = MemoryAgent(Liar(), smol_tokenizer, template="notes", chunk_tokens=300)
    a = agent.ask(doc_with("The secret code is 4."), "What is the secret code?")
    assert any("does not match" in w for w in a.warnings)
    ok = MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=300)
    assert ok.ask(doc_with("The secret code is 4."), "What is the secret code?").warnings == []


# ---- chunks that end at sentence ends (--chunk-snap) ---------------------------------------------------

def _number_keeper(req):
    """Keeps the first seven-digit number a section shows (digits cut by a boundary are not one); answers
    with the kept number."""
    prompt = req.messages[-1]["content"]
    memory = re.search(r"<notes>\n(.*?)\n</notes>", prompt, re.S).group(1)
    memory = "" if memory.startswith("(no notes") else memory
    sec = re.search(r"<section>\n(.*)\n</section>", prompt, re.S)
    if sec is None:
        return f"\\boxed{{{memory or 'unknown'}}}"
    found = re.findall(r"(?<!\d)\d{7}(?!\d)", sec.group(1))
    return memory or (found[0] if found else "")


def test_chunk_snap_keeps_a_cut_fact_whole(smol_tokenizer):
    """A boundary inside the number leaves no whole number in either chunk; snapped chunks keep it whole."""
    text = doc_with("The secret code is 7341298.", before=20, after=20)
    _, starts = smol_tokenizer.encode_offsets(text)
    inside = text.index("7341298") + 4
    chunk = max(i for i, s in enumerate(starts) if s <= inside)  # the first chunk ends inside the number
    at = text.index("7341298")
    assert at < starts[chunk] < at + 7  # the token-exact boundary falls inside the number

    def ask(snap):
        return MemoryAgent(ScriptedBackend(policy=_number_keeper), smol_tokenizer, template="notes",
                           chunk_tokens=chunk, memory_tokens=64, chunk_snap=snap).ask(text, "What is the code?")

    exact, snapped = ask(0), ask(48)
    assert exact.answer != "7341298" and snapped.answer == "7341298"
    agent = MemoryAgent(ScriptedBackend(), smol_tokenizer, template="notes", chunk_tokens=128, chunk_snap=16)
    assert agent.settings()["chunk_snap"] == 16  # a state file of other chunks is another read
    assert "chunk_snap" not in MemoryAgent(ScriptedBackend(), smol_tokenizer, chunk_tokens=128).settings()
    for bad in (128, -1, 2.5, True):
        with pytest.raises(ValueError, match="chunk_snap"):
            MemoryAgent(ScriptedBackend(), smol_tokenizer, chunk_tokens=128, chunk_snap=bad)


def test_chunk_snap_is_part_of_an_eval_folder(smol_tokenizer, tmp_path, capsys):
    from memagent.cli import main
    from memagent.eval import EvalConfig

    assert EvalConfig(tasks=["x"], lengths=[1], chunk_snap=32).identity()["chunk_snap"] == 32
    assert "chunk_snap" not in EvalConfig(tasks=["x"], lengths=[1]).identity()  # old folders still resume
    (tmp_path / "d.txt").write_text("some text. " * 50)
    rc = main(["ask", str(tmp_path / "d.txt"), "Q?", "--backend", "instant", "--chunk-tokens", "64",
               "--chunk-snap", "64"])
    assert rc == 2 and "chunk_snap" in capsys.readouterr().err
