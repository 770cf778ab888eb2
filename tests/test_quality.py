"""Unreliable answers say so (issue 11 item 16): every update cut at the cap, or a repetitive memory."""
import pytest

from memagent import MemoryAgent
from memagent.backends.scripted import ScriptedBackend
from memagent.quality import memory_warnings, repetitive

DOC = "The lamp was lit at dusk by the keeper. " * 150  # ~1500 tokens: three chunks of 512


@pytest.fixture
def agent(smol_tokenizer):
    def make(policy, memory_tokens=64):
        return MemoryAgent(ScriptedBackend(policy=policy), smol_tokenizer, template="notes", chunk_tokens=512,
                           memory_tokens=memory_tokens)
    return make


def test_every_update_capped_warns(agent):
    # a model that writes far past the cap on every update (the cap counts byte-tokens here)
    a = agent(lambda req: " ".join(f"note{i}" for i in range(200)), memory_tokens=64).ask(DOC, "Who lit it?")
    assert a.chunks >= 2 and a.capped_updates == a.chunks
    assert any("hit the 64-token memory cap" in w for w in a.warnings), a.warnings


def test_repetitive_memory_warns(agent):
    a = agent(lambda req: "<section>\n<section>\n<section>\n<section>", memory_tokens=256).ask(DOC, "Who lit it?")
    assert any("repetitive" in w for w in a.warnings), a.warnings


def test_a_healthy_read_has_no_warning(agent):
    a = agent(lambda req: "The keeper lit the lamp at dusk.", memory_tokens=256).ask(DOC, "Who lit it?")
    assert a.warnings == []


@pytest.mark.parametrize("memory,flag", [
    ("<section>\n<section>\n<section>", True),
    ("a fact\nanother fact\na third one", False),
    ("the keeper said that " * 10, True),
    ("The keeper lit the lamp at dusk; the ship Aurora passed at nine; the code is 4471 and the log ends.", False),
    ("", False),
])
def test_repetitive(memory, flag):
    assert bool(repetitive(memory)) is flag


def test_one_capped_update_is_not_a_pattern():
    assert memory_warnings("x", updates=1, capped=1, memory_tokens=64) == []
    assert memory_warnings("x", updates=3, capped=2, memory_tokens=64) == []
    assert len(memory_warnings("x", updates=3, capped=3, memory_tokens=64)) == 1
