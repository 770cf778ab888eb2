"""Warnings that an answer is unreliable, from what the read itself shows (no model, no ground truth).

Why: a small model that writes until the cap cuts every note it takes, and one that loses the thread
copies the same line over and over (`<section>`, `<section>`, ...). Either way the final answer comes
from a memory that cannot hold the evidence, and nothing said so. These checks are cheap and run once
per question at the end of a read:

- every update was cut at the memory cap (at least two, so a one-chunk read is not called a pattern);
- the final memory is repetitive: one line makes up half of at least three lines, or fewer than half of
  its word 4-grams are distinct (at least 16 words).
"""
from __future__ import annotations

import re
from collections import Counter

MIN_UPDATES = 2
MIN_WORDS = 16
DISTINCT_4GRAMS = 0.5


def repetitive(memory: str) -> str | None:
    """A short reason when `memory` repeats itself, else None."""
    lines = [x.strip() for x in memory.splitlines() if x.strip()]
    if len(lines) >= 3:
        line, count = Counter(lines).most_common(1)[0]
        if count >= 3 and count * 2 >= len(lines):
            return f"the line {line[:40]!r} fills {count} of its {len(lines)} lines"
    words = re.findall(r"\w+|[^\w\s]+", memory.lower())
    if len(words) >= MIN_WORDS:
        grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
        share = len(set(grams)) / len(grams)
        if share < DISTINCT_4GRAMS:
            return f"only {share:.0%} of its word 4-grams are distinct"
    return None


def memory_warnings(memory: str, updates: int, capped: int, memory_tokens: int) -> list[str]:
    """Warnings for one question's read: `updates` update calls made, `capped` of them cut at the cap."""
    out = []
    if updates >= MIN_UPDATES and capped >= updates:
        out.append(f"every memory update ({capped} of {updates}) hit the {memory_tokens}-token memory cap, so "
                   f"notes were cut each time: the answer is unreliable (a larger --memory-tokens or a stronger "
                   "model may help)")
    why = repetitive(memory)
    if why:
        out.append(f"the memory became repetitive ({why}): the model lost track, the answer is unreliable")
    return out
