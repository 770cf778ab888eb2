"""Gates that save model calls: skip the memory update on irrelevant chunks, stop reading once answered.

In the spirit of GRU-Mem (arXiv 2602.10560; see shared/reference/research-peers.md §1.2), which trains
the model to emit an *update gate* (keep the old memory) and an *exit gate* (stop reading). We have no
gate-trained model, so the two gates here are ones an untrained model can live with:

- **Skip-update, `lexical`** (model-free, decided *before* the call, so a skipped chunk costs no call at
  all): the chunk is skipped when it mentions none of the question's key terms and none of the key
  terms the memory has gained since it started. The memory is kept unchanged. Terms come from the
  question and the memory, never from the document, so the decision depends only on what the reader
  already holds. Chunk boundaries fall anywhere (mid-sentence, mid-word: "tart-" | "pear is: 4521"),
  so a chunk is matched together with its neighbours' edges: the end of the previous chunk and the
  start of the next, up to `CONTEXT_CHARS` and never across a blank line (a new paragraph). A fact cut
  in two by a boundary then keeps both halves when either names a term.
- **Early exit, `marker`** (model-emitted): the template's `update_exit` prompt tells the model to end
  its memory with the template's `exit_marker` line once the memory answers the question. The reader
  strips the marker from the memory and stops reading; the final answer call follows at once.

Key terms (`key_terms`): words are runs of letters/digits, joined across `-` and `'` ("tart-pear",
"arthur's"), case-folded, accents removed, a trailing possessive or plural "s" dropped. Two kinds:
*names* — a word with a digit, an inner hyphen, or a capital letter where a sentence does not start
or that opens a run of capitalised words ("Scott Derrickson", "1846", "tart-pear", a UUID) — and *content words* (the rest, minus a small
stopword list and the words task instructions use: "question", "document", "mentioned", ...). When the
question has names, only names count (for the question and for what the memory adds); otherwise content
words do. Names are what lookup questions hinge on, and content words such as "first" or "started" occur
in almost every chunk of real text, which would leave nothing to skip.

What it can miss (measured in benchmarks/bench_gates.py as "evidence recall"):
- A fact more than `CONTEXT_CHARS` past the last mention of a term in its paragraph, when a chunk
  boundary falls in between ("Charles Barkley ... [boundary] ... he wore 32 in honour of ...").
- Evidence that shares no term with the question: the second hop of a multi-hop question whose bridge
  entity appears only *later* in the document than the hop it links to, or a paraphrase ("the French
  capital" for "Paris"), a different spelling, a coreference ("she") in a chunk of its own.
- The bridge is caught only when the model writes the bridge name into its memory (the memory's new
  names are added to the terms); a model that writes poor notes gets no such help.
- Aggregation questions (count, most frequent, every occurrence: RULER cwe / fwe) need every chunk; the
  gate is for lookup questions and must stay off for those.
A model-free *exit* was considered and rejected: "the memory mentions every question term" or "the
memory stopped changing" fire whenever a small model copies the question or stalls, long before the
evidence is read, so neither is an honest signal that the question is answered.
"""
from __future__ import annotations

import re
import unicodedata

SKIP_MODES = ("off", "lexical")
EXIT_MODES = ("off", "marker")

# Function words plus the words task instructions and our own templates use; none of them says where
# the answer is. Kept short on purpose: every word here is one the gate will never match on.
STOPWORDS = frozenset("""
a about above after again against all also am an and any are as at be because been before being below
between both but by can could did do does doing done down during each either else ever every few for from
further had has have having he her here hers herself him himself his how i if in into is it its itself
just least less let like may me might more most much must my myself neither no nor not now of off on once
one only or other ought our ours ourselves out over own per same shall she should since so some such than
that the their theirs them themselves then there these they this those though through thus to too under
until up upon us very via was we were what whatever when where whereas whether which while who whom whose
why will with within without would yet you your yours yourself yourselves
answer answers question questions document documents text texts passage section notes note memory
mentioned provided given following give find tell name named called based according hidden make sure
memorize quiz afterwards output words word other another
""".split())

CONTEXT_CHARS = 300  # neighbours' edges matched with a chunk: a sentence or two (~75 tokens)
_WORD = re.compile(r"[^\W_]+(?:['\u2019\-][^\W_]+)*")
_SENTENCE_END = set(".!?:\n\r\"'([{<\u201c\u2018")


def _fold(word: str) -> str:
    """Case-folded, accents removed, possessive and plural 's' dropped ("Arthur's" -> "arthur")."""
    w = word.casefold()
    if not w.isascii():
        w = "".join(c for c in unicodedata.normalize("NFKD", w) if not unicodedata.combining(c))
    for tail in ("'s", "\u2019s"):
        if w.endswith(tail):
            w = w[: -len(tail)]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")) and not w[-2].isdigit():
        w = w[:-1]
    return w


def words(text: str) -> set[str]:
    """Every folded word of `text` (what a chunk is matched against)."""
    return {_fold(m.group(0)) for m in _WORD.finditer(text)}


def _starts_sentence(text: str, at: int) -> bool:
    i = at - 1
    while i >= 0 and text[i] in " \t":
        i -= 1
    if i >= 1 and text[i] == "." and text[i - 1].isupper() and (i < 2 or not text[i - 2].isalpha()):
        return False  # an initial ("George R.R. Martin") does not end a sentence
    return i < 0 or text[i] in _SENTENCE_END


def key_terms(text: str) -> tuple[set[str], set[str]]:
    """(names, content words) of `text`, folded; see the module docstring for the rules."""
    names, content = set(), set()
    found = list(_WORD.finditer(text))
    for k, m in enumerate(found):
        raw = m.group(0)
        w = _fold(raw)
        if len(w) < 2 or w in STOPWORDS or raw.casefold() in STOPWORDS:
            continue
        capital = raw[0].isupper()
        if capital and _starts_sentence(text, m.start()):
            # "Charles Barkley ..." opens a sentence with a name; "Make sure ..." opens it with a verb
            nxt = found[k + 1] if k + 1 < len(found) else None
            capital = bool(nxt and nxt.group(0)[0].isupper() and text[m.end():nxt.start()].strip(" \t") == "")
        if capital or any(c.isdigit() for c in raw) or "-" in raw or any(c.isupper() for c in raw[1:]):
            names.add(w)
        elif len(w) > 2:
            content.add(w)
    return names, content - names


def edges(previous: str | None, following: str | None, limit: int = CONTEXT_CHARS) -> tuple[str, str]:
    """(end of the previous chunk, start of the next) that belong with a chunk: at most `limit`
    characters each, cut at the nearest blank line, so a paragraph's continuation travels with it."""
    before = (previous or "")[-limit:]
    cut = before.rfind("\n\n")
    before = before[cut + 2:] if cut >= 0 else before
    after = (following or "")[:limit]
    cut = after.find("\n\n")
    return before, after[:cut] if cut >= 0 else after


class LexicalSkipGate:
    """Decides, before any call, whether a chunk may change the memory (see the module docstring).

    One gate per (question, empty-memory marker); `keep(memory, chunk)` is pure and cheap (one regex
    pass over the chunk), so the reader calls it per chunk and per question without caching.
    """

    def __init__(self, question: str, empty_memory: str = ""):
        names, content = key_terms(question)
        self.use_names = bool(names)
        self.terms = frozenset(names if names else content)
        # the empty-memory marker's words and the question's own words are not news in a memory
        self._known = words(empty_memory) | words(question)

    def memory_terms(self, memory: str) -> set[str]:
        names, content = key_terms(memory)
        return (names if self.use_names else content) - self._known

    def keep(self, memory: str, chunk: str | frozenset[str]) -> bool:
        """True when the chunk (its text, or its `words`) mentions a question term or a memory term."""
        terms = self.terms | self.memory_terms(memory)
        if not terms:  # a question made only of stopwords: nothing to go on, so never skip
            return True
        return not terms.isdisjoint(words(chunk) if isinstance(chunk, str) else chunk)


def find_marker(text: str, marker: str) -> tuple[str, bool]:
    """(text without any line-insensitive, case-insensitive occurrence of `marker`, whether it was there)."""
    if not marker:
        return text, False
    pattern = re.compile(re.escape(marker.strip()), re.I)
    out, n = pattern.subn("", text)
    return (out.strip(), True) if n else (text, False)
