"""Reports whose people are look-alikes of one another (shape `roster` of rl/notes_prose.py).

Why: in the report shape (rl/notes_report.py) every person holds a different role, so a question for a
role has one obvious sentence, and round 24's reads got people right in most groups: its step learned
counts, not people, and lost a held-out person (docs/notes-model.md, "DAPO round 24"). The held-out
misses that no round has fixed are people of the *same kind* told apart by a word: the new holder of a
post and the one before, the winner of one prize among several, who was in charge on one day, the
treasurer beside the deputy treasurer. Here the organisation's report (same organisations, opening lines
and filler as the report shape) tells 2-4 people of one kind, and the question names the one word that
tells them apart:
* handover: a post passes from one person to another within the period; asked for the new holder or
  the old one (both names are in the evidence sentence);
* awards: 3-4 prizes, each to a different person; asked for one prize's winner;
* rota: 3-4 days, each run by a different person; asked for one day;
* deputy: a role and its deputy or assistant, held by two people; asked for either.
Other people in other roles and a count or two are there as well, so the document still reads as a
report and the other look-alikes of round 24 stay in view.
"""
from __future__ import annotations

import random

from .notes_prose import _FIRST, _LAST, _MONTHS, _TOWNS, _cap
from .notes_report import COUNT_LINES, ORGS, OPENERS, ROLE_LINES, ROLE_QUESTIONS, _CMP, _DAYS, _date, \
    _numbers, _report_filler

HANDOVER_LINES = (  # {a} the one before, {b} the new holder, {r} the post
    "{a} stepped down as {r} in {month}, and {b} has taken the job on.",
    "{b} is our new {r}, taking over from {a}, who stays on as a volunteer.",
    "After {years} years as {r}, {a} has handed over to {b}.",
    "The {r}'s job passed from {a} to {b} halfway through the {period}.",
    "{a}, {r} until {day}, has moved to {Town2}; {b} is {r} from now on.",
)
HANDOVER_NEW = ("Who is the {r} now?", "Who is the new {r}?", "Who has taken over as {r}?",
                "Who is the current {r} of the {org}?")
HANDOVER_OLD = ("Who was the {r} before the change?", "Who was the previous {r}?",
                "Who handed over the job of {r}?", "Who was {r} before {b}?")
AWARDS = ("newcomer's cup", "long-service badge", "prize for the best idea", "volunteer of the {period} award",
          "chairman's shield", "thank-you hamper", "first prize in the raffle", "cup for the most improved member")
AWARD_LINES = ("The {w} went to {n}.", "{n} was given the {w}, to loud applause.",
               "This {period} the {w} was won by {n}.", "For the {w}, the committee chose {n}.")
AWARD_QUESTIONS = ("Who won the {w}?", "Who was given the {w}?", "Who received the {w} this {period}?",
                   "To whom did the {w} go?")
ROTA_LINES = ("{day}'s session was run by {n}.", "On {day}, {n} was in charge.", "{n} looked after things on {day}.",
              "The {day} shift fell to {n}.")
ROTA_QUESTIONS = ("Who was in charge on {day}?", "Who ran the {day} session?", "Who looked after things on {day}?",
                  "Whose shift was it on {day}?")
_DEPUTY_HEADS = ("treasurer", "secretary", "chair", "manager", "officer", "captain", "director", "curator",
                 "coordinator", "organiser", "lead")
KINDS = ("handover", "awards", "rota", "deputy")


def roster_fact(rng: random.Random):
    """(gold sentences, distractor sentences, question, answers, subject, opening line, filler stream), as
    notes_report.report_fact, for a report whose asked person has look-alikes of the same kind."""
    org, period, roles_all, things_all = rng.choice(ORGS)
    town, town2 = rng.sample(_TOWNS, 2)
    kind = rng.choice(KINDS)
    roles = rng.sample(roles_all, rng.randint(2, 4))  # roles[0] is the asked post (handover, deputy)
    names = rng.sample([f"{f} {l}" for f in rng.sample(_FIRST, 12) for l in rng.sample(_LAST, 8)], len(roles) + 8)
    people, pool = names[:len(roles)], names[len(roles):]  # pool: the same-kind people, then visitors
    things = rng.sample(things_all, rng.randint(1, 2))
    fill = dict(period=period, org=org, Town=town, Town2=town2, cmp=rng.choice(_CMP))
    say = lambda f, **kw: _cap(f.format(**fill, **kw))  # noqa: E731
    others = [say(rng.choice(ROLE_LINES), r=r, n=n) for r, n in zip(roles[1:], people[1:])]
    others += [say(rng.choice(COUNT_LINES), k=k, t=t, v=v) for k, (t, v) in zip(_numbers(rng, len(things)), things)]
    subject, avoid = None, set()
    if kind == "handover":
        r, old, new = roles[0], pool.pop(), people[0]
        gold = [say(rng.choice(HANDOVER_LINES), a=old, b=new, r=r, month=rng.choice(_MONTHS),
                    years=rng.randint(3, 30), day=rng.choice(_DAYS))]
        if rng.random() < 0.6:
            question, answer = rng.choice(HANDOVER_NEW).format(r=r, org=org), new
        else:
            question, answer = rng.choice(HANDOVER_OLD).format(r=r, b=new), old
        if len(roles) > 2 and rng.random() < 0.5:  # another post changed hands too
            others[0] = say(rng.choice(HANDOVER_LINES), a=pool.pop(), b=people[1], r=roles[1],
                            month=rng.choice(_MONTHS), years=rng.randint(3, 30), day=rng.choice(_DAYS))
        subject = r
    elif kind in ("awards", "rota"):
        slots = rng.sample([w.format(period=period) for w in AWARDS] if kind == "awards" else _DAYS, rng.randint(3, 4))
        holders = [pool.pop() for _ in slots]
        lines = AWARD_LINES if kind == "awards" else ROTA_LINES
        facts = [say(rng.choice(lines), w=s, day=s, n=n) for s, n in zip(slots, holders)]
        gold, others = facts[:1], facts[1:] + others
        qs = AWARD_QUESTIONS if kind == "awards" else ROTA_QUESTIONS
        question, answer = say(rng.choice(qs), w=slots[0], day=slots[0]), holders[0]
        if kind == "rota":
            avoid.add(slots[0])  # no filler sentence about the asked day ("the Monday session was cancelled")
    else:  # deputy: the post and its deputy (or assistant), held by two people
        r = roles[0]
        second = ("deputy " if any(h in r for h in _DEPUTY_HEADS) else "assistant ") + r
        pair = [(r, people[0]), (second, pool.pop())]
        rng.shuffle(pair)  # pair[0] is asked
        facts = [say(rng.choice(ROLE_LINES), r=pr, n=pn) for pr, pn in pair]
        gold, others = facts[:1], facts[1:] + others
        question, answer = rng.choice(ROLE_QUESTIONS).format(r=pair[0][0], org=org), pair[0][1]
        subject = pair[0][0]
    rng.shuffle(others)
    avoid.add(answer)
    opener = rng.choice(OPENERS).format(date=_date(rng), **fill)
    return gold, others, question, (answer,), subject, opener, _report_filler(rng, fill, pool[-3:], avoid)
