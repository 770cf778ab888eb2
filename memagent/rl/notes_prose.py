"""Facts told in ordinary prose, for the notes-model training data (rl/notes_data.py draws these).

Why a second fact generator: the first (notes_data.FACTS) speaks in the key-value shapes of needle
benchmarks ("The code for X is Y."), and a model trained only on those learns to keep sentences of that
shape and to drop everything else, including a fact a person wrote in a diary or a report. Here the same
skill (keep the asked fact, drop look-alike facts about other things) is drawn in prose shapes:
* an attribute of a thing ("the combination of the dented trunk"), a person named in a role, and a
  stated extreme in a record ("the highest tide in the harbour book");
* one- and two-sentence wordings, the value at the start, middle or end of the sentence, and wordings
  that name the thing in one sentence and give its value only in the next (a note that keeps the first
  sentence alone has lost the answer);
* distractors that share the attribute (other things), the thing (other attributes), the role (other
  roles) or the measure (other readings that are not the extreme);
* on request only (shape role_split), a role whose person is named a sentence later, among names that are
  no person in the asked role (a ship, an inn, a visitor);
* on request only (shape role_told), the same, but the role's sentence is long and sounds finished (a
  coach, a date, a town) and the name's sentence runs on past the name;
* on request only, facts a qualifier tells apart from a look-alike: a post handed from one person to
  another, asked for the new holder or the old (role_handover), and one attribute of one thing on several
  days, asked for one day's value (attr_dated);
* on request only (shape report), a whole document about one organisation, its people in their roles
  and its counts of different things, in report sentences of its own (rl/notes_report.py), and (shape
  roster) the same kind of report whose asked person has look-alikes of the same kind: the post's holder
  before, another prize's winner, another day's person, the deputy (rl/notes_roster.py);
* on request only (shape paraphrase), an event told in none of its question's words, often beside a
  sentence in the question's own words that is not the answer (rl/notes_paraphrase.py);
* questions phrased several ways;
* on request only (notes_words_share), the quantities of a fact and its look-alikes written in words
  ("two hundred and thirty degrees", "twenty-eight pupils"), as people write them: every other value here
  is digits, and held-out set 6 found the trained model keeping 2 of 6 such quantities (docs/notes-model.md).

Held out on purpose (never drawn here): the planted-fact benchmark's attribute ("access code"), and the
demo document's measure (barometer) and role (keeper): tests/test_notes_training.py checks that no
fact wording, question or evidence drawn here mentions them (the haystack text is not filtered), so the demo and the planted-fact cells stay measurements of transfer.
"""
from __future__ import annotations

import random
import re

from ..tasks import data as corpora

_FIRST = ("Aino", "Bastian", "Celia", "Dario", "Elif", "Fenna", "Gideon", "Halima", "Ivo", "Jana", "Kasimir",
          "Liesel", "Marek", "Noor", "Odile", "Pavel", "Renata", "Silas", "Thea", "Umar", "Vera", "Willem",
          "Yara", "Zeno", "Maud", "Florian", "Ottilie", "Cyrus")
_LAST = ("Ashdown", "Brightwell", "Corrigan", "Delacroix", "Ellery", "Fairweather", "Grünwald", "Hollis",
         "Ingram", "Joubert", "Kettering", "Lowry", "Marchetti", "Nyberg", "Oyelaran", "Penhallow", "Ravel",
         "Szabo", "Thornbury", "Underhill", "Vasquez", "Whitcombe", "Yilmaz", "Zielinski")
_TOWNS = ("Harrowby", "Kestrel Bay", "Old Marton", "Saltcombe", "Wendover", "Ashby Cross", "Port Ellery",
          "Brackenfield", "Linmouth", "Stanwick", "Fallowmere", "Deepdale")
_COLOURS = ("crimson", "teal", "ochre", "ivory", "slate grey", "mustard", "navy", "olive", "lilac", "rust")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")

ATTRS = (  # (attribute, value kind); "access code" is the planted-fact benchmark's and is never drawn
    ("combination", "digits"), ("serial number", "code"), ("password", "word"), ("room number", "small"),
    ("licence number", "code"), ("phone extension", "digits"), ("locker number", "small"),
    ("registration", "code"), ("nickname", "word"), ("owner", "name"), ("maker", "name"),
    ("weight", "kilograms"), ("length", "metres"), ("price", "money"), ("year of purchase", "year"),
    ("colour", "colour"), ("home port", "town"), ("inspection date", "date"), ("catalogue number", "digits"),
    ("pin number", "digits"), ("tracking number", "code"), ("motto", "word"),
)
ATTR_FACTS = (
    "The {a} of {e} is {v}.",
    "{E} has {v} as its {a}.",
    "Someone had scratched a note inside the lid: the {a} of {e} was {v}.",
    "As it turns out, the {a} of {e} is {v}, which nobody had thought to write down before.",
    "We checked the {a} of {e} twice, and it is {v}.",
    "The {a} for {e}, according to the old inventory, is {v}.",
    "Then there is {e}. Its {a}, for the record, is {v}.",
    "In the end the {a} of {e} proved to be {v}, not what the label said.",
    "{v} - that is the {a} of {e}, as the clerk confirmed.",
    "My sister reminded me that {e} carries the {a} {v}.",
    # the thing named in one sentence, its value in the next (the value is a sentence away from the key)
    "{E} turned up at the back of the shed. Its {a}, painted on the side, was {v}.",
    "Nobody had looked at {e} for years. When we finally did, the {a} on it read {v}.",
    "Then we came to {e}. I wrote its {a} on my cuff: {v}.",
)
ATTR_QUESTIONS = (
    "What is the {a} of {e}?",
    "Which {a} does {e} have?",
    "What {a} was recorded for {e}?",
    "Tell me the {a} of {e}.",
    "According to the text, what is the {a} of {e}?",
    "Find the {a} of {e} in the document.",
)
ROLES = ("night porter", "harbour master", "ship's cook", "head gardener", "new schoolteacher", "station clerk",
         "ferry pilot", "choir leader", "village doctor", "ward nurse", "bell ringer", "quartermaster",
         "head librarian", "mill foreman", "chief engineer", "postmistress", "surveyor", "deputy mayor")
ROLE_FACTS = (
    "The {r} is called {n}.",
    "{n} has been appointed {r}.",
    "Our {r}, {n}, came by this afternoon with news from town.",
    "The {r} arrives next week. I hear the name is {n}.",
    "Everyone agrees that the best {r} the town ever had was {n}.",
    "A letter came today: the post of {r} goes to {n}.",
    "The {r} - a quiet person named {n} - keeps to the back room.",
    "We will have a new {r} from the spring. Her name is {n}, and she comes well recommended.",
    "The old {r} retired last winter. The replacement, {n}, has settled in well.",
    "A {r} joins us after the holidays. They say he is called {n}, a cousin of the baker.",
)
# Two-sentence roles: the role in one sentence, the person's name only in the next, often behind a pronoun.
# A note that keeps the first sentence alone has lost the answer (DAPO round 7's largest-but-one failure).
ROLE_SPLIT_FACTS = tuple(f for f in ROLE_FACTS if f.count(". ") == 1 and f.index("{n}") > f.index(". ")) + (
    "The {r} starts on Monday. Word in the village is that she is {n}, from the coast.",
    "We hear a new {r} is on the way. His name, I gather, is {n}.",
    "The {r} will be with us by the end of the month. People say her name is {n}.",
    "Nobody had met the new {r} until this morning. He introduced himself as {n}.",
    "The post of {r} was filled at last. It went to a young woman, {n}, who trained in the city.",
    "The {r} is expected on the evening coach. The letter gives the name as {n}.",
    "Our {r} leaves us in the spring. The one taking over, they say, is {n}.",
    "A new {r} has been found. She is {n}, and she has done the work for years.",
)
# role_told: a role's sentence that reads as a whole piece of news (how and when the person comes, from
# where) and only then a sentence that names them and runs on. A note that stops after the first sentence,
# or keeps its coach, date or town as the answer, has lost the name (DAPO round 14 on the README demo).
ROLE_TOLD_NEWS = (
    "The {r} is expected on the {v} on {d}.",
    "A new {r} will reach us with the {v} some time around {d}.",
    "The {r} we were promised is coming over from {t} on the {v}.",
    "Nothing can be settled until the new {r} gets here on the {v}, which should be {d}.",
    "The post of {r} has stood empty since the spring, but the board writes that it will be filled by {d}.",
    "Our next {r} should arrive by {d}, travelling up from {t} with two trunks and a bicycle.",
    "The {r} is to come out to us on the {v}, weather allowing, on {d}.",
    "We have word at last about the {r}: the {v} brings them from {t} on {d}.",
)
ROLE_TOLD_NAMES = (
    "Rumour has it she is {n}, who spent {k} years in {t2} and brings her own tools.",
    "The letter gives his name as {n}, formerly of {t2}, a man who is said never to take a day off.",
    "Her name, so the carter says, is {n}; she ran the office at {t2} for {k} winters.",
    "{n} is the name on the papers, and by all accounts he plays the fiddle badly.",
    "All we know is that she is called {n} and that she has asked for a room with a view of the water.",
    "They tell me his name is {n}, that he trained in {t2}, and that he cannot abide cats.",
    "It is to be {n}, late of {t2}, whose last employer wrote three pages in praise of her.",
    "The name we were given is {n}; he comes from {t2} with a good word from his last post.",
    "She signs her letters {n}, and she has already sent ahead a crate of books.",
)
_VEHICLES = ("evening coach", "mail steamer", "market cart", "Thursday ferry", "first train", "carrier's wagon",
             "packet boat", "night bus")
_DAYS = ("the first of {m}", "the third of {m}", "the last day of {m}", "the second Monday in {m}",
         "the fourteenth", "the morning tide next week", "the end of the month")
# Names that are not the asked person: a ship, an inn, a lane, a dog, a person in no role. The notes must
# tell the asked role's person from every other name in the text (round 8 wrote a ship's name instead).
NAME_MENTIONS = (
    "A steamer, the {f} of {t}, put in at noon and left again on the tide.",
    "We drank to the harvest at the {l} Arms.",
    "{n} from {t} came by to borrow a ladder.",
    "The dog, {f}, has taken to sleeping by the stove.",
    "A parcel came addressed to {n}, though nobody of that name lives here.",
    "They have renamed the lane {l} Row, after the old squire.",
    "My brother wrote from {t}; he sends his love to {n}.",
    "The fishing boat {f} {l} was hauled up for painting.",
)
ROLE_QUESTIONS = ("What is the name of the {r}?", "Who is the {r}?", "Who was named {r}?",
                  "Which person is the {r}?")
MEASURES = (("temperature", "degrees"), ("wind speed", "knots"), ("tide", "metres"), ("rainfall", "millimetres"),
            ("catch", "kilograms"), ("attendance", "people"), ("price of coal", "shillings"), ("score", "points"))
RECORDS = ("the harbour book", "the season's register", "the old diary", "the survey notes", "the club minutes",
           "the shipping log", "the school report", "the market accounts")
EXTREMES = ("highest", "lowest", "largest", "smallest")
EXTREME_FACTS = (
    "The {x} {m} in {rec} is {v}.",
    "Of every {m} in {rec}, the {x} was {v}, underlined twice.",
    "{rec_cap} gives {v} as the {x} {m} it ever held.",
    "The {x} {m} ever written into {rec}, in blue pencil, is {v}.",
    "One entry in {rec} stands out from the rest. It is the {x} {m} there: {v}.",
    "We went through {rec} page by page. The {x} {m} it holds turned out to be {v}.",
)
READING = ("On a {day} the {m} was {v}.", "A {m} of {v} was noted one {day}.", "{rec_cap} shows a {m} of {v}.")
EXTREME_QUESTIONS = ("What is the {x} {m} in {rec}?", "What was the {x} {m} recorded in {rec}?",
                     "Which {x} {m} does {rec} give?")


def _value(kind: str, rng: random.Random) -> str:
    w = corpora.wonderwords_lists()
    if kind == "digits":
        d = rng.randint(4, 8)
        return str(rng.randint(10 ** (d - 1), 10 ** d - 1))
    if kind == "small":
        return str(rng.randint(2, 999))
    if kind == "code":
        return f"{''.join(rng.choice('ABCDEFGHJKLMNPRSTUVWXYZ') for _ in range(rng.randint(1, 3)))}-{rng.randint(10, 9999)}"
    if kind == "word":
        return rng.choice(w["noun"]) if rng.random() < 0.5 else f"{rng.choice(w['adjective'])} {rng.choice(w['noun'])}"
    if kind == "name":
        return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    if kind in ("kilograms", "metres"):
        return f"{rng.randint(2, 950)} {kind}"
    if kind == "money":
        return f"{rng.randint(3, 900)} pounds"
    if kind == "year":
        return str(rng.randint(1820, 2019))
    if kind == "colour":
        return rng.choice(_COLOURS)
    if kind == "town":
        return rng.choice(_TOWNS)
    return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)}"


_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen")
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
# A bare count of 1-3 digits: not part of a code ("AB-123"), a decimal, a time, a thousands group, or a
# date ("12 March", which people do not write as "twelve March").
_COUNT = re.compile(r"(?<![\w-])(?<!\d[.,:/])(\d{1,3})(?!\w|[.,:/]\d|-\w)(?! (?:" + "|".join(_MONTHS) + r")\b)")


def number_words(n: int) -> str:
    """0-999 as British English writes them: 34 -> "thirty-four", 230 -> "two hundred and thirty"."""
    if not 0 <= n <= 999:
        raise ValueError(f"number_words covers 0-999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else "")
    return f"{_ONES[n // 100]} hundred" + (f" and {number_words(n % 100)}" if n % 100 else "")


def _in_words(gold: list[str], distract: list[str], answers: tuple[str, ...]):
    """The fact with its counts written in words, look-alikes too (a model must not learn that the worded
    sentence is the asked one). The digit form stays an accepted answer: the reward asks for the value,
    not its spelling. None when the answer has no bare count to write."""
    if not any(_COUNT.search(a) for a in answers):
        return None

    def word(t: str) -> str:
        return _COUNT.sub(lambda m: number_words(int(m.group(1))), t)

    def say(sentence: str) -> str:  # a sentence that opened with its count still opens with a capital
        return _cap(word(sentence)) if sentence[:1].isdigit() else word(sentence)

    return [say(g) for g in gold], [say(d) for d in distract], tuple(word(a) for a in answers) + answers


def _maybe_in_words(task, rng: random.Random, gold, distract, answers):
    """notes_words_share of the facts in words. At 0 no random number is drawn, so every earlier config
    draws the documents it drew before."""
    if task.words_share and rng.random() < task.words_share:
        return _in_words(gold, distract, answers) or (gold, distract, answers)
    return gold, distract, answers


def _entity(rng: random.Random) -> str:
    w = corpora.wonderwords_lists()
    r = rng.random()
    if r < 0.5:
        return f"the {rng.choice(w['adjective'])} {rng.choice(w['noun'])}"
    if r < 0.75:
        return f"the {rng.choice(w['noun'])} in {rng.choice(_TOWNS)}"
    return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}'s {rng.choice(w['noun'])}"


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _attr(rng: random.Random) -> tuple[list[str], list[str], str, tuple[str, ...]]:
    """(gold sentences, distractor sentences, question, answers) about one attribute of one thing."""
    (a, kind), e = rng.choice(ATTRS), _entity(rng)
    fmt = rng.choice(ATTR_FACTS)
    v = _value(kind, rng)
    say = lambda f, a_, e_, v_: _cap(f.format(a=a_, e=e_, E=_cap(e_), v=v_))  # noqa: E731
    distract, seen = [], {(a, e)}
    for _ in range(rng.choice((0, 1, 2, 3, 4, 6))):
        if rng.random() < 0.6:  # the same attribute of another thing (the hard case)
            a2, kind2, e2 = a, kind, _entity(rng)
        else:  # another attribute of the same thing
            (a2, kind2), e2 = rng.choice(ATTRS), e
        if (a2, e2) not in seen:
            seen.add((a2, e2))
            distract.append(say(fmt if rng.random() < 0.5 else rng.choice(ATTR_FACTS), a2, e2, _value(kind2, rng)))
    return [say(fmt, a, e, v)], distract, rng.choice(ATTR_QUESTIONS).format(a=a, e=e), (v,), None


def _role(rng: random.Random):
    roles = rng.sample(ROLES, rng.randint(1, 5))
    names = rng.sample([f"{f} {l}" for f in rng.sample(_FIRST, 6) for l in rng.sample(_LAST, 4)], len(roles))
    facts = [rng.choice(ROLE_FACTS).format(r=r, n=n) for r, n in zip(roles, names)]
    facts = [_cap(f) for f in facts]
    return facts[:1], facts[1:], rng.choice(ROLE_QUESTIONS).format(r=roles[0]), (names[0],), roles[0]


def _role_split(rng: random.Random):
    """A role whose person is named a sentence later, among other roles and other names (see NAME_MENTIONS)."""
    roles, people = _roles_and_people(rng)
    gold = _cap(rng.choice(ROLE_SPLIT_FACTS).format(r=roles[0], n=people[0]))
    return [gold], _role_distractors(rng, roles, people), rng.choice(ROLE_QUESTIONS).format(r=roles[0]), \
        (people[0],), roles[0]


def _roles_and_people(rng: random.Random) -> tuple[list[str], list[str]]:
    """1-4 roles and a person for each plus 3 more (for NAME_MENTIONS); the first pair is the asked one."""
    roles = rng.sample(ROLES, rng.randint(1, 4))
    names = [f"{f} {l}" for f in rng.sample(_FIRST, 8) for l in rng.sample(_LAST, 5)]
    return roles, rng.sample(names, len(roles) + 3)


def _role_distractors(rng: random.Random, roles: list[str], people: list[str]) -> list[str]:
    """The other roles' people and 1-3 names that are no person in a role (ships, inns, lanes), shuffled;
    roles[0] / people[0] are the asked ones. Shared by role_split and role_told in one draw order, so
    role_split's documents are the ones rounds 9-13 trained on."""
    others = [_cap(rng.choice(ROLE_FACTS + ROLE_SPLIT_FACTS).format(r=r, n=n)) for r, n in zip(roles[1:], people[1:])]
    mentions = []
    for m, n in zip(rng.sample(NAME_MENTIONS, rng.randint(1, 3)), people[len(roles):]):
        f, l, t = rng.choice(_FIRST), rng.choice(_LAST), rng.choice(_TOWNS)
        if f"{f} {l}" == people[0]:  # a boat named exactly like the answer would make two right readings
            l = next(x for x in _LAST if x != l)  # no further draw: every other document stays the same
        mentions.append(_cap(m.format(f=f, l=l, t=t, n=n)))
    distract = others + mentions
    rng.shuffle(distract)
    return distract


def _role_told(rng: random.Random):
    """A role told as finished news (a coach, a date, a town) before the sentence that names its person; the
    other roles, people and names as in _role_split."""
    roles, people = _roles_and_people(rng)
    t, t2 = rng.sample(_TOWNS, 2)
    day = rng.choice(_DAYS).format(m=rng.choice(_MONTHS))
    news = rng.choice(ROLE_TOLD_NEWS).format(r=roles[0], v=rng.choice(_VEHICLES), d=day, t=t)
    gold = _cap(news) + " " + rng.choice(ROLE_TOLD_NAMES).format(n=people[0], t2=t2, k=rng.randint(2, 19))
    return [gold], _role_distractors(rng, roles, people), rng.choice(ROLE_QUESTIONS).format(r=roles[0]), \
        (people[0],), roles[0]


# role_handover: one role, two people, the post passing from one to the other; the question asks for the
# new holder or the one before. Every handled document names both, so a note must keep which is which: the
# held-out misses of rounds 13-16 kept the first-named person when the question asked for the newer one.
HANDOVER_FACTS = (  # {o} leaves the post of {r}, {n} takes it
    "{o} has stepped down as {r} after {k} years. The new {r} is {n}.",
    "After {k} years as {r}, {o} is retiring, and {n} takes over at the end of the month.",
    "{n} replaces {o} as {r} this spring.",
    "The post of {r} passes from {o} to {n} on {d}.",
    "We said goodbye to {o}, our {r} since {y}. Taking the post now is {n}, who comes from {t}.",
    "The board chose {n} as the next {r}, so {o} can finally rest.",
    "{o}, the old {r}, handed everything over to {n} on {d}.",
    "Until {d} the {r} was {o}. It is {n} now.",
    "{n} was voted in as {r}; the outgoing {r}, {o}, thanked everyone for {k} good years.",
    "Since {o} left for {t}, the work of the {r} has been done by {n}.",
)
_PAST_DAYS = ("the first of {m}", "the last day of {m}", "the second Monday in {m}", "the fourteenth of {m}")
HANDOVER_NEW = ("Who is the new {r}?", "Who took over as {r}?", "Who is the {r} now?",
                "Who holds the post of {r} at present?")
HANDOVER_OLD = ("Who was the {r} before {n}?", "Who was the previous {r}?", "Who stepped down as {r}?",
                "Which person used to be the {r}?")
# attr_dated: one attribute of one thing given on several occasions, the question naming one of them. The
# asked occasion is anywhere in the order, so neither "keep the first" nor "keep the latest" is the skill.
OCCASIONS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
DATED_FACTS = (
    "On {o}, the {a} of {e} was {v}.",
    "The {a} of {e} read {v} on {o}.",
    "{o}'s entry gives the {a} of {e} as {v}.",
    "When we looked again on {o}, {e} had {v} as its {a}.",
    "By {o} the {a} of {e} had become {v}.",
)
DATED_QUESTIONS = ("What was the {a} of {e} on {o}?", "On {o}, what {a} did {e} have?",
                   "Which {a} was given for {e} on {o}?", "What did the {a} of {e} read on {o}?")


def _role_handover(rng: random.Random):
    """A role passing from one person to another, asked for the new holder (7 in 10) or the one before; the
    other roles, people and names as in _role_split."""
    roles, people = _roles_and_people(rng)
    old = rng.choice([f"{f} {l}" for f in _FIRST for l in _LAST if f"{f} {l}" not in people])
    t = rng.choice(_TOWNS)
    day = rng.choice(_PAST_DAYS).format(m=rng.choice(_MONTHS))
    new = people[0]
    gold = _cap(rng.choice(HANDOVER_FACTS).format(r=roles[0], o=old, n=new, k=rng.randint(3, 30),
                                                  y=rng.randint(1950, 2015), d=day, t=t))
    if rng.random() < 0.7:
        question, answer = rng.choice(HANDOVER_NEW).format(r=roles[0]), new
    else:
        question, answer = rng.choice(HANDOVER_OLD).format(r=roles[0], n=new), old
    distract = [d for d in _role_distractors(rng, roles, people) if old not in d]
    return [gold], distract, question, (answer,), roles[0]


def _attr_dated(rng: random.Random):
    """The same attribute of the same thing on 2-5 days, each value different; the question names one day.
    Sometimes (1 in 3) another thing's value on the asked day is there too."""
    (a, kind), e = rng.choice([x for x in ATTRS if x[1] not in ("colour", "town")]), _entity(rng)
    days = rng.sample(OCCASIONS, rng.randint(2, 5))
    values: list[str] = []
    while len(values) < len(days):
        v = _value(kind, rng)
        if all(v not in u and u not in v for u in values):
            values.append(v)
    fmt = rng.choice(DATED_FACTS)
    say = lambda f, d, e_, v: _cap(f.format(a=a, e=e_, v=v, o=d))  # noqa: E731
    facts = [say(fmt if rng.random() < 0.5 else rng.choice(DATED_FACTS), d, e, v) for d, v in zip(days, values)]
    asked = rng.randrange(len(days))
    distract = facts[:asked] + facts[asked + 1:]
    if rng.random() < 1 / 3:
        v2 = _value(kind, rng)
        if all(v2 not in u and u not in v2 for u in values):
            distract.append(say(rng.choice(DATED_FACTS), days[asked], _entity(rng), v2))
    question = rng.choice(DATED_QUESTIONS).format(a=a, e=e, o=days[asked])
    return [facts[asked]], distract, question, (values[asked],), None


def _extreme(rng: random.Random):
    (m, unit), rec, x = rng.choice(MEASURES), rng.choice(RECORDS), rng.choice(EXTREMES)
    lo, hi = (10, 400) if unit != "people" else (40, 5000)
    v = rng.randint(lo, hi)
    others = rng.sample(range(lo, hi), rng.randint(0, 4))
    others = [o for o in others if (o < v if x in ("highest", "largest") else o > v)]
    fill = dict(m=m, rec=rec, rec_cap=_cap(rec), x=x)
    gold = _cap(rng.choice(EXTREME_FACTS).format(v=f"{v} {unit}", **fill))
    days = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
    distract = [_cap(rng.choice(READING).format(v=f"{o} {unit}", day=rng.choice(days), **fill)) for o in others]
    return [gold], distract, rng.choice(EXTREME_QUESTIONS).format(**fill), (f"{v} {unit}",), None


def prose_fact(task, rng: random.Random, n_chunks: int, index: int):
    """One document whose asked fact is told in prose (see the module docstring); a notes_data.Sample."""
    from .notes_report import report_fact  # they import this module's names lists
    from .notes_paraphrase import paraphrase_fact
    from .notes_roster import roster_fact

    # The default draw weighs attributes twice; a config may narrow it (notes_prose_shapes) to aim a round at
    # the one shape its reads fail on, e.g. roles in DAPO round 7. role_split and role_told are opt-in (not in
    # the default shapes), so the default draws the same documents as before they existed.
    shape = rng.choice([s for s in ("attr", "attr", "role", "extreme", "role_split", "role_told",
                                    "role_handover", "attr_dated", "report", "roster", "paraphrase")
                        if s in task.prose_shapes])
    if shape in ("report", "roster"):  # a whole document about one organisation, its own filler
        gold, distract, question, answers, subject, opener, filler = (report_fact if shape == "report"
                                                                      else roster_fact)(rng)
        task._titles = (opener, None)  # the report's own opening line, first whatever the title draw was
        gold, distract, answers = _maybe_in_words(task, rng, gold, distract, answers)
        return _place(task, rng, n_chunks, index, shape, "report", filler, gold, distract, question, answers,
                      subject)
    # `subject`: the role a role question asks about, which a title may name (notes_title_share).
    gold, distract, question, answers, subject = {"attr": _attr, "role": _role, "extreme": _extreme,
                                         "role_split": _role_split, "role_told": _role_told,
                                         "role_handover": _role_handover, "attr_dated": _attr_dated,
                                         "paraphrase": paraphrase_fact}[shape](rng)
    gold, distract, answers = _maybe_in_words(task, rng, gold, distract, answers)
    # Why noise haystacks are opt-in here: a model that only ever met "The grass is green." around needles
    # learned to keep any short "The X is Y" sentence (docs/notes-model.md, stage 2). At 0 no random number
    # is drawn, so the held-out prose documents (benchmarks/notes_heldout.py) stay the same documents.
    if task.prose_noise and rng.random() < task.prose_noise:
        hay = "noise"
    else:
        hay = rng.choice(("essay", "essay", "squad", "hotpot"))
    filler = task._filler(hay, rng, "", ("words", "numbers"), set())
    return _place(task, rng, n_chunks, index, shape, hay, filler, gold, distract, question, answers, subject)


def _place(task, rng, n_chunks, index, shape, hay, filler, gold, distract, question, answers, subject):
    from .data import Sample

    chunks, ev_sents = task._layout(rng, n_chunks, filler, gold + distract, n_gold=len(gold), subject=subject)
    evidence = [[e for e in per if e in gold] for per in ev_sents]
    placed = {e for per in ev_sents for e in per}
    distract = [d for d in distract if d in placed]  # _pack may cut a unit placed past the last chunk
    return Sample(id=f"notes-{task.seed}-{index}", question=question, answers=answers, chunks=tuple(chunks),
                  meta={"evidence": evidence, "haystack": hay, "distractors": len(distract), "kind": f"prose-{shape}",
                        "distractor_facts": distract})
