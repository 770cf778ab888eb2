"""Facts told in other words than the question asks them (shape `paraphrase` of rl/notes_prose.py).

Why: every other shape states its fact with the question's own words ("the new surveyor is ...", "the
combination of ..."), so a reader can pass them all by keeping whatever shares words with the question.
Held-out set 7 found exactly that in the default (docs/notes-model.md, session 13): 4 of the 8 questions
that share words with their evidence, 0 of the 8 whose evidence says the same thing in other words, while
the untrained base read 2 of those 8. Here the asked event is told with none of the question's content
words ("Who mended the roof?" over "... spent Sunday up a ladder replacing the cracked slates ..."), and
the document often holds the opposite trap as well: a sentence that repeats the question's words beside
someone or something that is not the answer (a person asking it, a wrong guess, a person everyone
expected to do it). So keeping what shares words with the question is a wrong read here, and only
keeping what answers it is right.
* Each event has two question wordings and two evidence wordings; tests/test_notes_paraphrase.py checks
  that no content word of any wording of a question (or a word with its first four letters) occurs in any
  wording of its evidence.
* Answers are people (3 in 5), counts (1 in 5) and towns (1 in 5); the other 1-3 events of the document
  have answers of the same kind, so every document holds look-alikes of the answer.
* Never drawn (as in rl/notes_prose.py): the demo's keeper and barometer and the planted-fact benchmark's
  access code. The held-out sets' own questions are not reworded here either: events are this module's.
"""
from __future__ import annotations

import random
import re
from typing import NamedTuple

from .notes_prose import _FIRST, _LAST, _TOWNS, _cap


class Event(NamedTuple):
    kind: str  # person | number | place: what the answer is
    questions: tuple[str, ...]
    evidence: tuple[str, ...]  # "{v}" is the answer
    doing: str | None = None  # the question's own words as an infinitive, for the "expected to" trap
    span: tuple[int, int] = (0, 0)  # number events: the range the count is drawn from


EVENTS = (
    Event("person", ("Who fixed the leaking roof?", "Who mended the roof that was leaking?"),
          ("{v} spent the whole of Sunday up a ladder, replacing the cracked slates above the kitchen.",
           "The drips over the kitchen stopped once {v} had climbed up and set new slates where the old ones had "
           "split."), "fix the leaking roof"),
    Event("person", ("Who rescued the drowning child?", "Who saved the child from drowning?"),
          ("When the little boy slipped off the jetty and went under, it was {v} who dived in and hauled him back "
           "to the bank.",
           "{v} jumped into the millpond fully clothed and dragged the small lad out before he sank a third time.")),
    Event("person", ("Who won the race?", "Who came first in the race?"),
          ("{v} crossed the finishing line a good ten strides ahead of every other runner.",
           "Nobody could keep up with {v}, who breasted the tape long before the rest of the field."), "win the race"),
    Event("person", ("Who baked the wedding cake?", "Who baked the cake for the wedding?"),
          ("The three tiers of sponge and marzipan that the couple cut at the reception came out of {v}'s oven.",
           "{v} was up until two in the morning icing the tiers that the bride and groom sliced into at the "
           "reception."), "bake the wedding cake"),
    Event("person", ("Who stole the money?", "Who was stealing money from the shop?"),
          ("In the end it was {v} who had been slipping coins out of the till whenever nobody was looking.",
           "The takings that kept vanishing had gone into {v}'s pockets, a few coins at a time.")),
    Event("person", ("Who taught the children to swim?", "Who gave the children swimming lessons?"),
          ("Every morning that summer {v} stood waist-deep in the lake, showing the youngsters how to keep afloat.",
           "The little ones learned to stay afloat in the river thanks to {v}, who was patient with every one of "
           "them."), "teach the children to swim"),
    Event("person", ("Who recovered the lost keys?", "Who turned up the keys that had been lost?"),
          ("{v} came across the missing bunch for the front door under a cushion in the parlour.",
           "It was {v} who spotted the jangling iron ring beneath the bench by the gate.")),
    Event("person", ("Who painted the picture in the hall?", "Which artist painted the picture hanging in the hall?"),
          ("The oil canvas above the staircase is the work of {v}, who spent a whole winter on it.",
           "{v} brushed the landscape over the stairs from memory, layer on layer."), "paint the picture in the hall"),
    Event("person", ("Who wrote the letter of complaint?", "Who wrote to complain?"),
          ("The angry note delivered to the town hall was penned by {v}.",
           "{v} put the grievance on paper, three furious pages of it, and posted it to the mayor's office.")),
    Event("person", ("Who treated the injured horse?", "Who looked after the hurt horse?"),
          ("{v}, the vet from over the hill, bandaged the mare's torn leg and sat with her all night.",
           "The lame mare pulled through because {v} dressed her wound twice a day."), "treat the injured horse"),
    Event("person", ("Who cooked dinner for the guests?", "Who prepared the meal for the guests?"),
          ("The roast and the pies the visitors ate that evening all came from {v}'s kitchen.",
           "{v} fed the whole visiting party that night, a pot of stew and four loaves.")),
    Event("person", ("Who sold the farm?", "Who sold off the family farm?"),
          ("{v} signed the fields and the barns over to a buyer from the city.",
           "The land and the cowsheds went to a stranger for cash, and the signature on the deed was {v}'s."),
          "sell the farm"),
    Event("person", ("Who planted the apple trees?", "Who planted the apple trees behind the chapel?"),
          ("The orchard was set out by {v}, sapling by sapling, forty years ago.",
           "{v} dug every hole for the orchard's saplings one autumn long ago."), "plant the apple trees"),
    Event("person", ("Who repaired the broken clock?", "Who got the broken clock working again?"),
          ("{v} had the old timepiece in the tower ticking once more within a week.",
           "After {v} took the tower's mechanism apart and oiled each cog, the hands began to move once more."),
          "repair the broken clock"),
    Event("person", ("Who delivered the baby?", "Who helped deliver the baby?"),
          ("It was {v} who saw the young mother through the birth in the small hours.",
           "{v} stayed at the mother's side until the newborn gave its first cry at dawn.")),
    Event("person", ("Who captained the team?", "Who was captain of the team?"),
          ("{v} wore the armband for the side all season and led them out every Saturday.",
           "The eleven took their orders on the pitch from {v}."), "captain the team"),
    Event("person", ("Who discovered the fossil?", "Who dug up the fossil?"),
          ("{v} was the one who chipped the ancient bones out of the cliff face.",
           "The petrified skeleton came to light when {v} went walking under the cliffs after a storm.")),
    Event("person", ("Who guarded the prisoner overnight?", "Who kept guard over the prisoner overnight?"),
          ("{v} sat outside the cell until dawn with a lamp and a pistol.",
           "The captive never left {v}'s sight from dusk till daybreak."), "guard the prisoner overnight"),
    Event("person", ("Who translated the book?", "Who did the translation of the book?"),
          ("The version of the novel on our shelves is the work of {v}, who grew up speaking both languages.",
           "{v} rendered the whole novel from the original tongue in under two years."), "translate the book"),
    Event("person", ("Who designed the bridge?", "Who drew up the plans for the bridge?"),
          ("The span over the river was the brainchild of {v}, who sketched it on a napkin.",
           "Every arch of the crossing at the ford came off {v}'s drawing board."), "design the bridge"),
    Event("person", ("Who put out the fire?", "Who stopped the fire?"),
          ("{v} ran back and forth with buckets until the last of the flames in the barn had died.",
           "The blaze in the hayloft was smothered by {v}, who beat it down with wet sacks.")),
    Event("person", ("Who carried the injured climber down the mountain?", "Who brought the injured climber down?"),
          ("{v} bore the hurt man on her back all the way from the summit ridge to the valley.",
           "The lad with the broken ankle reached the valley only because {v} hauled him from the ridge.")),
    Event("person", ("Who gave the speech at the opening?", "Who made the speech at the opening ceremony?"),
          ("{v} stood on a crate and addressed the crowd before the ribbon was cut.",
           "The words that launched the new hall were spoken by {v}, just before the doors swung wide."),
          "give the speech at the opening"),
    Event("number", ("How many guests attended the wedding?", "How many guests came to the wedding?"),
          ("{v} people squeezed into the chapel to watch the couple say their vows.",
           "The chapel was packed for the vows: {v} people, some standing at the back."), span=(30, 300)),
    Event("number", ("How much did the repairs cost?", "What was the cost of the repairs?"),
          ("Mending everything came to {v} pounds in the end.",
           "The builder's bill for putting it all right was {v} pounds."), span=(120, 9000)),
    Event("number", ("How many sheep were lost in the storm?", "How many sheep died in the storm?"),
          ("When the gale had passed, the shepherd counted {v} fewer ewes than before.",
           "The blizzard took {v} of the flock, buried in drifts on the high pasture."), span=(5, 90)),
    Event("number", ("How many books does the library own?", "How many books are in the library?"),
          ("The shelves of the reading room hold {v} volumes.",
           "All told, {v} volumes sit on the shelves of the reading room."), span=(2000, 40000)),
    Event("number", ("How tall is the tower?", "What is the height of the tower?"),
          ("From its base to the weathervane the spire rises {v} metres.",
           "The spire climbs {v} metres above the square."), span=(20, 95)),
    Event("number", ("How many students enrolled this year?", "How many students joined the school this year?"),
          ("{v} new pupils signed up for the autumn term.",
           "The autumn term opened with {v} new pupils on the register."), span=(15, 400)),
    Event("number", ("How many people died in the fire?", "How many people were killed in the fire?"),
          ("The blaze claimed {v} lives before dawn.",
           "When the flames were out, {v} had perished."), span=(2, 40)),
    Event("number", ("How long did the voyage last, in days?", "How many days did the voyage take?"),
          ("The ship finally docked {v} sunrises after it had sailed.",
           "Counting from the morning it sailed, the vessel was {v} dawns at sea."), span=(6, 90)),
    Event("place", ("Where was the treasure buried?", "Where was the treasure hidden?"),
          ("The chest of coins lay under three feet of earth beside the well at {v}.",
           "Whoever dug beside the old well at {v} would have struck the chest of coins.")),
    Event("place", ("Where did the couple spend their honeymoon?", "Where did the couple go for their honeymoon?"),
          ("The pair passed their first fortnight as husband and wife in {v}.",
           "Straight after the vows the newlyweds took the train to {v} for two weeks.")),
    Event("place", ("Where was the meeting held?", "In which town did the meeting take place?"),
          ("Everyone gathered in the back room of the inn at {v} to talk it over.",
           "The committee sat down together at the {v} inn to thrash it out.")),
    Event("place", ("Where was the stolen van found?", "Where did the stolen van turn up?"),
          ("Police came across the vehicle abandoned on a lane outside {v}.",
           "The missing vehicle was left in a ditch near {v}, its doors wide open.")),
    Event("place", ("Where did the painter grow up?", "In which town did the painter grow up?"),
          ("The woman behind the portraits spent her childhood in {v}.",
           "Long before the portraits, she was a girl running along the harbour wall at {v}.")),
)

# The traps: the question's own words beside someone who is not the answer, or a wrong value ({w}).
PERSON_TRAPS = ("'{q}' {m} asked over supper, and for a while nobody answered.",
                "The note {m} pinned on the board asked only this: {q}",
                "{m} kept asking around the village: {q}")
DOING_TRAPS = ("Everyone had expected {m} to {d}.", "{m} had been saying for weeks that somebody ought to {d}.",
               "{m} offered to {d}, but was told it was not needed.")
VALUE_TRAPS = ("'{q}' {m} asked, and guessed {w}.", "{m} wrote to ask: {q} Her own guess was {w}.",
               "When {m} was asked '{q}', the reply was a shrug and a wrong guess of {w}.")

_STOP = frozenset("""who whom what which where when how many much long does did were was is are the a an of in
    for to from and that this with be been have has had they them their there at on by into off this year""".split())


def content_words(text: str) -> set[str]:
    """The words of `text` that carry its meaning (4+ letters, not a function word), lower-cased."""
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) >= 4 and w not in _STOP}


def shares_a_stem(a: set[str], b: set[str]) -> set[str]:
    """Words of `a` that begin with the same four letters as a word of `b`: "mended" and "mends", "roof" and
    "roofs" count as one word. Stricter than a stemmer ("party" meets "part"), which is the safe side."""
    return {x for x in a for y in b if x[:4] == y[:4]}


def _names(rng: random.Random, k: int) -> list[str]:
    return rng.sample([f"{f} {l}" for f in rng.sample(_FIRST, 8) for l in rng.sample(_LAST, 6)], k)


def _values(kind: str, span: tuple[int, int], rng: random.Random, k: int) -> list[str]:
    """k different answers of one kind; no number is part of another (sub_em would accept "57" in "157")."""
    if kind == "person":
        return _names(rng, k)
    if kind == "place":
        return rng.sample(_TOWNS, k)
    out: list[str] = []
    while len(out) < k:
        v = str(rng.randint(*span))
        if all(v not in u and u not in v for u in out):
            out.append(v)
    return out


def paraphrase_fact(rng: random.Random):
    """(gold sentences, distractor sentences, question, answers, subject) for one paraphrased event among
    1-3 other events with answers of the same kind, and (7 in 10) a trap in the question's own words."""
    kind = rng.choice(("person", "person", "person", "number", "place"))
    pool = [e for e in EVENTS if e.kind == kind]
    events = rng.sample(pool, 1 + rng.randint(1, 3))
    # other events may share the asked one's span; the trap's wrong value is drawn from the asked event's
    values = [_values(kind, e.span, rng, 1)[0] for e in events]
    while len(set(values)) < len(values) or any(a != b and (a in b or b in a) for a in values for b in values):
        values = [_values(kind, e.span, rng, 1)[0] for e in events]
    asked = events[0]
    question = rng.choice(asked.questions)
    gold = [_cap(rng.choice(asked.evidence).format(v=values[0]))]
    distract = [_cap(rng.choice(e.evidence).format(v=v)) for e, v in zip(events[1:], values[1:])]
    if rng.random() < 0.7:
        # A draw with no usable name or wrong value (six small counts all part of an answer) gets no trap
        # rather than failing the document; every other draw is unchanged by that.
        someone = next((n for n in _names(rng, 4) if n not in values), None)
        if someone and kind == "person":
            traps = PERSON_TRAPS + (DOING_TRAPS if asked.doing else ())
            distract.append(_cap(rng.choice(traps).format(q=question, m=someone, d=asked.doing)))
        elif someone:
            wrong = next((w for w in _values(kind, asked.span, rng, 6)
                          if all(w not in v and v not in w for v in values)), None)
            if wrong:
                distract.append(_cap(rng.choice(VALUE_TRAPS).format(q=question, m=someone, w=wrong)))
    rng.shuffle(distract)
    return gold, distract, question, (values[0],), None
