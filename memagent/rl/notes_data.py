"""Training documents whose evidence a program knows, for teaching a small model to keep notes.

Why a separate generator (not `data.KVTask`): the skill we train is *what to keep and what to drop*, and
an untrained model fails exactly where the document holds look-alike facts for other keys. So every
document here mixes, by a seeded draw:
* facts in one of several wordings (not one benchmark's), keys and values of several shapes (word pairs,
  numbers, UUID-like ids, names, codes), one to three values per asked key, zero to many distractor keys
  in the same wording, sometimes keys that share a word with the asked one;
* haystacks of different kinds: essay prose, repeated noise sentences, lines made *only* of distractor
  facts, HotpotQA / SQuAD paragraphs;
* question phrasings with and without a preamble;
* document-QA questions from the *training* halves of SQuAD (split by article) and HotpotQA (split by
  gold title), whose evidence sentences are known (the answer's sentence; the supporting facts);
* facts told in ordinary prose (rl/notes_prose.py: attributes of things, people in roles, stated
  extremes in records), each with look-alike distractors, for a `prose_share` of the samples;
* 1 to `max_chunks` chunks of `chunk_tokens` tokens.

Each sample also carries `meta["evidence"]`: per chunk, the evidence sentences it holds. From that,
`oracle_memories` writes the notes a perfect reader would keep (the evidence seen so far, verbatim),
which is what the supervised warm start (rl/sft.py) imitates. RL (rl/engine.py) uses the same samples and
looks only at the final answer. Sample `i` is a pure function of (seed, i), like rl/data.py.
"""
from __future__ import annotations

import random
import uuid

from ..tasks import data as corpora
from ..tasks.data import split_of
from ..tokenizer import Tokenizer
from .config import NOTES_DEFAULT_SHAPES, NOTES_PROSE_SHAPES
from .data import Sample, _filler_sentence
from .notes_prose import _cap, prose_fact

RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
FACTS = (  # {t}: the value's kind, singular; {T}: plural
    "One of the special magic {T} for {k} is: {v}.",
    "The {t} for {k} is {v}.",
    "{K} has been assigned the {t} {v}.",
    "Remember: the secret {t} of {k} is {v}.",
    "Note for later - {k}: {t} {v}.",
    "The {t} that belongs to {k} is {v}.",
    "According to the records, the {t} of {k} is {v}.",
    "If anyone asks about {k}, the {t} is {v}.",
)
QUESTIONS = (
    "What is the {t} for {k}?",
    "What are all the special magic {T} for {k} mentioned in the provided text?",
    "Find the {t} of {k}.",
    "Which {t} was given to {k}?",
    "Tell me the {t} associated with {k}.",
    "{K}: what is its {t}?",
    "What {t} does the text give for {k}?",
)
PREAMBLES = (
    "",
    "",
    "Some special magic {T} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {T} afterwards.\n",
    "The text below hides a few {T}; keep track of them.\n",
    "Read carefully, you will be asked about one {t}.\n",
)
# Sentences that sound like an answer and belong to no key (an opt-in `decoy_share` of needle documents).
# Why: in long essay text the 0.5B default kept the needle and then replaced it with a later essay sentence
# that read like an answer ("The answer to the paradox, I think, is ..."; docs/notes-model.md, the grid).
# A decoy either carries a value of the needle's kind (a read that copies it answers wrongly) or none.
DECOYS = (
    "The answer, as far as I can tell, is {v}.",
    "If you want the short version, it comes down to {v}.",
    "So the answer to the whole puzzle is {v}, or so the author claims.",
    "My own guess, for what it is worth, is {v}.",
    "It turned out that the missing piece was {v} all along.",
    "Everyone quotes {v} here, though few can say where it came from.",
    "The figure people remember from that year is {v}.",
    "The answer, I think, is that nobody really knows.",
    "What matters in the end is not the number but the habit of checking it.",
    "The real answer is simpler than it looks: you write it down as soon as you see it.",
)
# Title lines for notes_title_share: a heading such as "Minutes of the Oakley choir, spring meeting", the
# first thing a reader sees and, over "Who was named choir leader?", a look-alike answer that never is one.
# Real documents open with one; the generator's never did (DAPO round 14, docs/notes-model.md).
TITLE_FORMS = (
    "Minutes of the {P} {O}, {S} meeting",
    "{P} {O}: notes from the {S} term",
    "Annual report of the {P} {O}, {Y}",
    "A year with the {P} {O}",
    "The {P} {O} newsletter, {M} edition",
    "Diary kept for the {P} {O}, {S} {Y}",
    "Records of the {P} {O} for {Y}",
    "What happened at the {P} {O} this {S}",
)
TITLE_ORGS = ("rowing club", "choir", "allotment society", "chess club", "lifeboat crew", "parish council",
              "beekeepers' association", "drama group", "cycling club", "museum trust", "sailing club",
              "bell ringers", "walking group", "film society", "hockey club", "friends of the library",
              "repair cafe", "residents' association", "mill cooperative", "dig team")
TITLE_PLACES = (("Ash", "Bram", "Cold", "Elm", "Fen", "Hart", "Kings", "Long", "Marl", "North", "Oak", "Red",
                 "Stan", "Thorn", "West", "Wych"),
                ("ford", "bury", "ton", "wick", "ley", "mouth", "field", "combe", "stead", "holm"))
# Half of the titled documents whose question has a subject (a needle's key, a role) name it in the title
# instead ("The ward nurse's notebook, spring 1961" over "Who is the ward nurse?"): a heading that shares
# the question's words and still holds no answer is the strongest look-alike a heading can be.
SUBJECT_TITLE_FORMS = (
    "The {s}'s notebook, {S} {Y}",
    "Papers of the {P} {s}",
    "Notes on the {s}, {M} {Y}",
    "The {s}'s report to the {P} {O}",
    "{P} diary: the {s}'s {S}",
    "About the {s}: a {S} at {P}",
)
# An opt-in share (notes_title_word_share) of those titles keep only the subject's last word, as part of a
# book's or a place's name ("The Porter's Book, Hartford, 1961" over "Who is the night porter?"): a heading
# that shares one word with the question is the look-alike rounds 13-15 kept as a role's notes on the README
# demo, while the full-subject titles above were already passed over (docs/notes-model.md, round 16).
WORD_TITLE_FORMS = (
    "The {W}'s Book, {P}, {Y}",
    "{W}'s Journal from {P}, {S} {Y}",
    "Log of the {W}s' Hut at {P}, {M} {Y}",
    "The {P} {W}s' Association: {S} news",
    "Letters to the {W}, {P} {Y}",
    "The {W}'s Log of {P}, {S} season",
)
SEASONS = ("spring", "summer", "autumn", "winter")
MONTHS = ("January", "March", "May", "July", "September", "November")
OPENER_TOKENS = 40  # the_opening_share: the longest opener sentence
OPENER_RESERVE = 48  # tokens _spread leaves free per opened chunk, so the filler still fits n_chunks


def title_lines(rng: random.Random, word_share: float = 0.0) -> tuple[str, str | None]:
    """(a title, a title naming the subject with {s} or its last word {W} left to fill, or None for the plain
    one). The word form is drawn after everything else and only when word_share > 0, so at 0 every earlier
    seed draws the same titles."""
    fill = dict(P=rng.choice(TITLE_PLACES[0]) + rng.choice(TITLE_PLACES[1]), O=rng.choice(TITLE_ORGS),
                S=rng.choice(SEASONS), M=rng.choice(MONTHS), Y=rng.randint(1950, 2025))
    plain = rng.choice(TITLE_FORMS).format(**fill)
    named = rng.choice(SUBJECT_TITLE_FORMS).format(s="{s}", **fill) if rng.random() < 0.5 else None
    if named and word_share and rng.random() < word_share:
        named = rng.choice(WORD_TITLE_FORMS).format(W="{W}", **fill)
    return plain, named


KINDS = {  # value kind -> (singular names, plural names)
    "numbers": (("number", "code", "PIN"), ("numbers", "codes", "PINs")),
    "words": (("word", "password"), ("words", "passwords")),
    "uuids": (("uuid", "identifier"), ("uuids", "identifiers")),
    "codes": (("serial", "code"), ("serials", "codes")),
}
_FIRST = ("Alma", "Bruno", "Chiara", "Dmitri", "Esther", "Farid", "Greta", "Hugo", "Ines", "Jonas", "Keiko",
          "Lars", "Mira", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Tomas", "Ulla", "Viktor", "Wen")
_LAST = ("Abbott", "Brennan", "Castillo", "Dufour", "Eriksen", "Fischer", "Gallo", "Horvat", "Ivanova",
         "Jensen", "Kowalski", "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Quinn", "Rossi")
_PLACES = ("Project", "Room", "Vault", "Account", "Locker", "Station", "Ticket", "Unit", "Batch", "Server")


def _key(kind: str, rng: random.Random) -> str:
    w = corpora.wonderwords_lists()
    if kind == "words":
        return f"{rng.choice(w['adjective'])}-{rng.choice(w['noun'])}"
    if kind == "numbers":
        return str(rng.randint(10 ** 5, 10 ** 7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "names":
        return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    return f"{rng.choice(_PLACES)} {rng.choice(w['noun']).capitalize()}"


def _near_key(kind: str, key: str, rng: random.Random) -> str:
    """A look-alike key: shares a word (or digits) with `key`."""
    if kind == "words" and "-" in key:
        a, _ = key.split("-", 1)
        return f"{a}-{rng.choice(corpora.wonderwords_lists()['noun'])}"
    if kind == "names":
        return f"{key.split(' ')[0]} {rng.choice(_LAST)}"
    if kind == "places":
        return f"{key.split(' ')[0]} {rng.choice(corpora.wonderwords_lists()['noun']).capitalize()}"
    return _key(kind, rng)


def _value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        d = rng.randint(4, 9)
        return str(rng.randint(10 ** (d - 1), 10 ** d - 1))
    if kind == "words":
        w = corpora.wonderwords_lists()
        return f"{rng.choice(w['adjective'])}-{rng.choice(w['noun'])}"
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{''.join(rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ') for _ in range(2))}-{rng.randint(100, 99999)}"


class NotesTask:
    """Mixed needle and document-QA samples with known evidence (see the module docstring)."""

    name = "notes"

    def __init__(self, tokenizer: Tokenizer, chunk_tokens: int = 512, max_chunks: int = 8, memory_tokens: int = 64,
                 seed: int = 0, min_chunks: int = 1, qa_share: float = 0.25, prose_share: float = 0.0,
                 prose_noise: float = 0.0, late_share: float = 0.0, early_share: float = 0.0,
                 prose_shapes: tuple[str, ...] = NOTES_DEFAULT_SHAPES, needle_essay_share: float = 0.0,
                 decoy_share: float = 0.0, title_share: float = 0.0, title_word_share: float = 0.0,
                 qa_context_share: float = 0.0, words_share: float = 0.0, the_opening_share: float = 0.0,
                 the_first_share: float = 0.0):
        if not prose_shapes or set(prose_shapes) - set(NOTES_PROSE_SHAPES):
            raise ValueError(f"prose_shapes must be a non-empty subset of {NOTES_PROSE_SHAPES}, got {prose_shapes!r}")
        self.prose_shapes = tuple(prose_shapes)
        self.tok, self.chunk_tokens, self.max_chunks = tokenizer, chunk_tokens, max_chunks
        self.prose_share, self.prose_noise, self.late_share = prose_share, prose_noise, late_share
        self.early_share = early_share
        self.needle_essay_share, self.decoy_share, self.title_share = needle_essay_share, decoy_share, title_share
        self.title_word_share, self.qa_context_share = title_word_share, qa_context_share
        self.words_share = words_share  # prose facts with their counts in words (notes_prose._in_words)
        self.the_opening_share, self.the_first_share = the_opening_share, the_first_share
        self._open_first = False  # the_first_share: the sample being drawn is read from the middle of a text
        self._open_rng = None  # the_opening_share: set while the sample being drawn opens its inner chunks (_pack)
        self._titles = None  # title_lines() of the sample being drawn (sample() draws, _layout places one)
        self.min_chunks, self.memory_tokens, self.seed, self.qa_share = min_chunks, memory_tokens, seed, qa_share
        self._pools: dict = {}

    def held_out(self) -> "NotesTask":
        return self  # evaluation uses other generators (tasks/ruler.py, benchmarks), never these indices

    def ntok(self, text: str) -> int:
        return len(self.tok.encode(text))

    # ---- haystacks ---------------------------------------------------------------------------------

    def _pool(self, name: str) -> list:
        """Train-split material, parsed once per task (the raw JSON is never re-read per sample).

        essay: sentences; squad / hotpot: paragraphs (filler); squad_qa: (paragraph, answerable qas);
        hotpot_qa: (question, answer, supporting sentences) whose gold titles are all train-split."""
        if name not in self._pools:
            if name == "essay":
                self._pools[name] = corpora.essay_sentences()
            elif name in ("squad", "squad_arts"):
                arts = [a for a in corpora.load_json("squad")["data"] if split_of(a["title"]) == "train"]
                self._pools["squad"] = [p["context"] for a in arts for p in a["paragraphs"]]
                self._pools["squad_arts"] = [a["paragraphs"] for a in arts]
            elif name in ("hotpot", "hotpot_qa"):
                seen, paras, qa = set(), [], []
                for d in corpora.load_json("hotpotqa"):
                    for t, sents in d["context"]:
                        if t not in seen and split_of(t) == "train":
                            seen.add(t)
                            paras.append(f"{t}\n{''.join(sents)}")
                    qa.append(self._hotpot_entry(d))  # one per record (None: not usable), drawn by index
                self._pools["hotpot"], self._pools["hotpot_qa"] = paras, qa
        return self._pools[name]

    def _filler(self, kind: str, rng: random.Random, fact_fmt: str, kinds: tuple[str, str], avoid: set):
        """An endless stream of (text, separator) haystack units of one kind."""
        if kind == "essay":
            sents = self._pool("essay")
            i = rng.randrange(len(sents))
            while True:
                yield sents[i % len(sents)], " "
                i += 1
        elif kind == "noise":
            own = rng.random() < 0.5
            while True:
                yield (RULER_NOISE if not own else _filler_sentence(rng).strip()), " "
        elif kind == "needle":  # every line a fact for another key: only the key tells them apart
            while True:
                k = _key(kinds[0], rng)
                if k not in avoid:
                    yield fact_fmt.format(k=k, K=_cap(k), v=_value(kinds[1], rng)), "\n"
        else:  # squad / hotpot paragraphs, sentence by sentence, a blank line between paragraphs
            paras = self._pool(kind)
            while True:
                sents = corpora.split_sentences(paras[rng.randrange(len(paras))])
                for j, s in enumerate(sents):
                    yield s, ("\n\n" if j == len(sents) - 1 else " ")

    def _pack(self, units: list[tuple[str, str, bool, int]], n_chunks: int, opener_sep: str | None = None,
              inner: bool = False):
        """Units (text, separator, is_evidence, tokens) into chunks of <= chunk_tokens tokens, whole units only.

        With `opener_sep` (the_opening_share), every chunk but the document's first opens with an essay
        sentence that begins "The ", then `opener_sep`. Why: the default's notes open with "The" ("The
        special magic number for ... is ..."), and when a chunk also opens with "The ..." they go on
        copying the chunk's opening instead of the fact. Every one of the 21 wrong gated reads whose notes
        quote a chunk's opening quotes one that begins "The " (chunk_snap_cuts.py), and read alone, the
        needle's chunk of the 64K essay-number documents is answered 2 of 8 times when it opens with "The "
        and 55 of 55 otherwise (benchmarks/needle_chunk_alone.py, token-exact and snapped). Training
        chunks open with "The " only where the haystack happens to (14 of round 16's first 60 second
        chunks); this makes it the rule for a share of the documents, so that the copy stops paying."""
        chunks, evidence, cur, cur_ev, used, filled = [], [], [], [], 0, 0

        def opened() -> tuple[list[str], int]:
            if opener_sep is None or not (chunks or inner):
                return [], 0
            text, n = self._the_opener(self._open_rng, opener_sep)
            return [text + opener_sep], n

        cur, used = opened()
        for text, sep, ev, n in units:
            if used + n > self.chunk_tokens and filled:
                chunks.append("".join(cur))
                evidence.append(cur_ev)
                cur_ev, filled = [], 0
                if len(chunks) == n_chunks:
                    break
                cur, used = opened()
            cur.append(text + sep)
            filled += 1
            used += n
            if ev:
                cur_ev.append(text)
        if filled and len(chunks) < n_chunks:
            chunks.append("".join(cur))
            evidence.append(cur_ev)
        return chunks, evidence

    def _layout(self, rng, n_chunks, filler, planted: list[str], n_gold: int = 0, subject: str | None = None):
        """(chunks, per-chunk planted sentences): filler with `planted` at random positions. For a
        `late_share` of the documents of 2+ chunks, the first `n_gold` planted sentences (the evidence)
        all go in the last chunk and the rest (look-alikes) in the chunks before it.

        Why: a reader that writes the first look-alike it meets and then copies its notes through every
        later chunk is right whenever the evidence comes first, which a random layout makes common; only
        documents whose evidence comes last make keeping the first guess a wrong read (docs/notes-model.md,
        round 5: 61 of 80 reads copied chunk 1's notes unchanged). At 0 no number is drawn, so the
        documents of every earlier seed stay the same documents. `subject` (what the question asks about)
        may name a title (notes_title_share).

        `early_share` is the mirror image, for documents that have look-alikes: the evidence all in the
        first chunk and every look-alike after it. Why: at 16K the default's look-alike-key misses write the
        asked key beside a later needle's number (docs/notes-model.md, round 18), a rewrite that only
        documents whose look-alikes come after the evidence show as wrong. It is drawn first; `late_share`
        then takes the next share of the same draw."""
        title = None
        if self._titles:
            plain, named = self._titles
            word = subject.split()[-1] if subject else ""
            if named and "{W}" in named and not word.isalpha():  # "Letters to the 7834750" reads as nonsense
                named = None
            title = named.format(s=subject, W=_cap(word)) if named and subject else plain
        if n_gold and n_chunks > 1 and self.early_share and len(planted) > n_gold:
            r = rng.random()
            if r < self.early_share:
                first, first_ev = self._spread(rng, 1, filler, planted[:n_gold], title)
                rest, rest_ev = self._spread(rng, n_chunks - 1, filler, planted[n_gold:], inner=True)
                return first + rest, first_ev + rest_ev
            late = r < self.early_share + self.late_share
        else:  # without early_share the draw below is the only one, so earlier seeds keep their documents
            late = n_gold and n_chunks > 1 and self.late_share and rng.random() < self.late_share
        if late:
            early, early_ev = self._spread(rng, n_chunks - 1, filler, planted[n_gold:], title)
            last, last_ev = self._spread(rng, 1, filler, planted[:n_gold], inner=True)
            return early + last, early_ev + last_ev
        return self._spread(rng, n_chunks, filler, planted, title)

    def _spread(self, rng, n_chunks, filler, planted: list[str], title: str | None = None, inner: bool = False):
        """Filler units for n_chunks chunks with the planted sentences at random unit positions, after
        `title` (a heading line) when one is given. Each unit is tokenized once; its count travels with it
        into _pack, so a title takes its tokens from the filler and every chunk keeps its budget. `inner`:
        these chunks come after the document's first (their first one is not the document's opening), as
        are all of an untitled document's chunks when it is read from the middle of a text (the_first_share)."""
        inner = inner or (self._open_first and not title)
        openers = 0 if self._open_rng is None else n_chunks - (0 if inner else 1)
        budget = n_chunks * self.chunk_tokens - openers * OPENER_RESERVE
        head = [(title, "\n\n", False, self.ntok(title + "\n\n"))] if title else []
        units, used = [], sum(u[3] for u in head)
        planted_cost = sum(self.ntok(p) + 1 for p in planted)
        while used + planted_cost < budget * 0.97:
            text, sep = next(filler)
            n = self.ntok(text + sep)
            units.append((text, sep, False, n))
            used += n
        seps = {u[1] for u in units}
        sep = seps.pop() if seps in ({"\n"}, {"\n\n"}) else " "  # a planted paragraph among paragraphs
        for p in planted:
            units.insert(rng.randint(0, len(units)), (p, sep, True, self.ntok(p + sep)))
        return self._pack(head + units, n_chunks, sep if openers else None, inner)

    # ---- samples -----------------------------------------------------------------------------------

    def sample(self, index: int) -> Sample:
        for attempt in range(50):
            rng = random.Random(f"notes:{self.seed}:{index}:{attempt}")
            # The title draws from its own stream, so at 0 nothing is drawn and the documents of every
            # earlier seed stay the same documents. It is drawn here, before the kind, because all three
            # generators lay out through _layout, which places it (the generator may give the subject).
            title_rng = random.Random(f"notes-title:{self.seed}:{index}:{attempt}")
            titled = self.title_share and title_rng.random() < self.title_share
            self._titles = title_lines(title_rng, self.title_word_share) if titled else None
            # likewise its own stream: at 0 nothing is drawn
            open_rng = random.Random(f"notes-open:{self.seed}:{index}:{attempt}")
            opened = self.the_opening_share and open_rng.random() < self.the_opening_share
            self._open_rng = open_rng if opened else None
            # A read that starts in the middle of a text: its first chunk opens with "The ..." too and has
            # no title, so the notes are still empty when a "The" opening arrives. Why: that is when the
            # default copies the opening (a gated read that passes one chunk, a long read that has kept
            # nothing yet); two-chunk documents whose first chunk is plain never show it, because their
            # notes at chunk 2 are never empty (round 28's reads: none of 94 wrong ones copied the opener).
            self._open_first = bool(opened and self.the_first_share and open_rng.random() < self.the_first_share)
            if self._open_first:
                self._titles = None
            n_chunks = rng.randint(self.min_chunks, self.max_chunks)
            r = rng.random()
            try:
                if r < self.qa_share:
                    s = self._qa(rng, n_chunks, index)
                elif r < self.qa_share + self.prose_share:
                    s = prose_fact(self, rng, n_chunks, index)
                else:
                    s = self._needle(rng, n_chunks, index)
            finally:
                titled, self._titles, self._open_rng = self._titles, None, None
                open_first, self._open_first = self._open_first, False
            if s is not None and titled:
                s.meta["title"] = s.chunks[0].split("\n\n", 1)[0]  # _spread puts it first, then a blank line
            if s is not None and opened:
                s.meta["the_openings"] = True
            if s is not None and open_first and not titled:
                s.meta["read_from_middle"] = True  # every chunk opens with "The ..."
            if s is not None and self._fits(s):
                return s
        raise RuntimeError(f"notes task: no sample fits for index {index}")

    def _the_opener(self, rng: random.Random, sep: str) -> tuple[str, int]:
        """An essay sentence that begins "The " (at most OPENER_TOKENS tokens) and its tokens with `sep`."""
        if "essay_the" not in self._pools:
            self._pools["essay_the"] = [t for t in self._pool("essay") if t.startswith("The ") and
                                        len(t) < 200 and self.ntok(t) <= OPENER_TOKENS]
        text = rng.choice(self._pools["essay_the"])
        return text, self.ntok(text + sep)

    def _fits(self, s: Sample) -> bool:
        ev = [e for per in s.meta["evidence"] for e in per]
        return bool(ev) and self.ntok("\n".join(ev)) <= self.memory_tokens - 4

    def _needle(self, rng: random.Random, n_chunks: int, index: int) -> Sample | None:
        key_kind = rng.choice(("words", "words", "numbers", "uuids", "names", "places"))
        val_kind = rng.choice(("numbers", "numbers", "words", "uuids", "codes"))
        t = rng.choice(KINDS[val_kind][0])
        T = KINDS[val_kind][1][KINDS[val_kind][0].index(t)]
        fmt = rng.choice(FACTS).replace("{t}", t).replace("{T}", T)
        key = _key(key_kind, rng)
        n_vals = 1 if rng.random() < 0.8 or val_kind == "uuids" else rng.randint(2, 3)
        values = [_value(val_kind, rng) for _ in range(n_vals)]
        n_dis = rng.choice((0, 1, 2, 3, 4, 6, 8))
        dis_keys = set()
        while len(dis_keys) < n_dis:
            k = _near_key(key_kind, key, rng) if rng.random() < 0.3 else _key(key_kind, rng)
            if k != key:
                dis_keys.add(k)
        gold = [fmt.format(k=key, K=_cap(key), v=v) for v in values]
        distract = [fmt.format(k=k, K=_cap(k), v=_value(val_kind, rng)) for k in sorted(dis_keys)]
        # Both draws below happen only when their share is set, so every earlier seed keeps its documents.
        if self.needle_essay_share and rng.random() < self.needle_essay_share:
            hay = "essay"  # long prose is where the default loses needles (docs/notes-model.md, the grid)
        else:
            hay = rng.choice(("essay", "essay", "noise", "needle", "needle", "squad", "hotpot"))
        decoys = []
        if self.decoy_share and rng.random() < self.decoy_share:
            for fmt_d in rng.sample(DECOYS, rng.randint(1, 3)):  # distinct templates: distinct sentences
                v = _value(val_kind, rng)
                if not any(v in a or a in v for a in values):
                    decoys.append(fmt_d.format(v=v))
        filler = self._filler(hay, rng, fmt, (key_kind, val_kind), dis_keys | {key})
        chunks, ev_sents = self._layout(rng, n_chunks, filler, gold + distract + decoys, n_gold=len(gold),
                                        subject=key)
        evidence = [[e for e in per if e in gold] for per in ev_sents]
        placed = {e for per in ev_sents for e in per}
        decoys = [d for d in decoys if d in placed]  # _pack may cut a unit placed past the last chunk
        q = rng.choice(QUESTIONS)
        if n_vals > 1:
            q = rng.choice((QUESTIONS[1], "List every {t} given for {k}.", "What are the {T} for {k}?"))
        question = (rng.choice(PREAMBLES) + q).replace("{t}", t).replace("{T}", T)
        question = question.replace("{K}", _cap(key)).replace("{k}", key)
        return Sample(id=f"notes-{self.seed}-{index}", question=question, answers=tuple(values), chunks=tuple(chunks),
                      meta={"evidence": evidence, "haystack": hay, "distractors": n_dis, "kind": "needle",
                            "key": key, "distractor_keys": sorted(dis_keys), "decoys": decoys},
                      match="all" if n_vals > 1 else "any")

    @staticmethod
    def _hotpot_entry(d: dict) -> tuple | None:
        """(question, answer, supporting sentences) of a train-split HotpotQA record, or None."""
        titles = {t for t, _ in d["supporting_facts"]}
        if any(split_of(t) != "train" for t in titles) or d["answer"].lower() in ("yes", "no"):
            return None
        ctx = dict((t, s) for t, s in d["context"])
        gold = [ctx[t][i].strip() for t, i in d["supporting_facts"] if t in ctx and i < len(ctx[t])]
        return (d["question"], d["answer"], gold) if any(d["answer"].lower() in g.lower() for g in gold) else None

    def _qa(self, rng: random.Random, n_chunks: int, index: int) -> Sample | None:
        # drawn only when set, so every earlier seed keeps its documents
        if self.qa_context_share and rng.random() < self.qa_context_share:
            from .notes_squad import squad_in_context

            return squad_in_context(self, rng, n_chunks, index)
        if rng.random() < 0.6:
            para = rng.choice(rng.choice(self._pool("squad_arts")))
            qas = corpora.answerable(para)
            if not qas:
                return None
            qa = rng.choice(qas)
            answer = qa["answers"][0]["text"]
            gold_sents = [s for s in corpora.split_sentences(para["context"]) if answer in s][:1]
            question, hay = qa["question"], "squad"
        else:
            records = self._pool("hotpot_qa")
            entry = records[rng.randrange(len(records))]
            if entry is None:
                return None
            (question, answer, gold_sents), hay = entry, "hotpot"
        if not gold_sents:
            return None
        filler = self._filler(rng.choice(("squad", "hotpot", "essay")), rng, "", ("words", "numbers"), set())
        chunks, ev_sents = self._layout(rng, n_chunks, filler, gold_sents, n_gold=len(gold_sents))
        evidence = [[e for e in per if e in gold_sents] for per in ev_sents]
        question = as_asked(rng, question)
        return Sample(id=f"notes-{self.seed}-{index}", question=question, answers=(answer,), chunks=tuple(chunks),
                      meta={"evidence": evidence, "haystack": hay, "distractors": 0, "kind": "qa"})


def as_asked(rng: random.Random, question: str) -> str:
    """A training QA question, in RULER qa's wording 30% of the time and bare otherwise (one draw either way)."""
    return corpora.RULER_QA_PROMPT.format(q=question) if rng.random() < 0.3 else question


def oracle_memories(sample: Sample, empty: str) -> list[str]:
    """The notes after each chunk: every evidence sentence seen so far, verbatim, one per line."""
    kept, out = [], []
    for per in sample.meta["evidence"]:
        kept += [e for e in per if e not in kept]
        out.append("\n".join(kept) if kept else empty)
    return out


def oracle_answer(sample: Sample) -> str:
    return "\\boxed{" + ", ".join(sample.answers) + "}"
