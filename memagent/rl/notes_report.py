"""Reports of one organisation, for the notes-model training data (shape `report` of rl/notes_prose.py).

Why a report shape: every other fact generator plants a handful of facts in text about something else
(essays, noise, encyclopaedia paragraphs), so the asked fact is the one sentence of its kind and its
look-alikes are lists of parallel facts. The documents people hand a memory agent are more often one
piece of connected writing about one thing - a club's newsletter, a weekly report, meeting minutes -
where every paragraph names people in their own roles and gives counts of different things. On held-out
documents of that kind (docs/notes-model.md, "DAPO round 22", set 4) the default answered 4 of 16
questions over two chunks, and 12 of its 14 misses answered with another person or number of the same
document: the notes kept the asked role's or count's words beside a neighbour's value.

So here the whole document is about one organisation:
* an opening line that says what the document is, then plain sentences about the organisation's week
  or month (the filler), some with numbers and names of their own (hours, a visitor, a date);
* 2-5 people, each in a different role, told in report wordings (the name before or after the role, the
  role in an aside, the name a sentence later);
* 2-4 counts of different things the organisation did, each with its own noun and verb, and for the
  asked thing sometimes a part done by one person ("Of those, 47 were baked by Noor Hollis.") and last
  period's figure ("Last month, 290 loaves were baked.");
* a question for one person by role, or for one count by its thing and qualifier (this period, last
  period, or one person's part), so the look-alikes are the same document's other people and numbers.

Organisations, roles and counted things are our own lists, far from the held-out sets' subjects; the
demo's role (keeper) and measure (barometer) are never used (tests/test_notes_report.py checks).
"""
from __future__ import annotations

import random

from .notes_prose import _FIRST, _LAST, _MONTHS, _TOWNS, _cap

# (organisation, period, roles, counted things as (plural noun, passive verb)); every role and every
# thing of one organisation is distinct, so a question names exactly one of each.
ORGS = (
    ("community garden", "month", ("plot secretary", "treasurer", "compost warden", "water rota organiser",
                                   "chairwoman"),
     (("bags of compost", "spread"), ("sacks of potatoes", "lifted"), ("new plots", "let"),
      ("apple trees", "planted"), ("seed packets", "swapped"))),
    ("youth hostel", "week", ("night manager", "cook", "bookings clerk", "laundry manager", "handyman"),
     (("guests", "booked in"), ("beds", "made up"), ("breakfasts", "served"), ("bookings", "cancelled"),
      ("bicycles", "hired out"))),
    ("food bank", "week", ("coordinator", "van driver", "warehouse lead", "treasurer", "referral officer"),
     (("parcels", "handed out"), ("families", "registered"), ("tins", "donated"), ("deliveries", "made"),
      ("volunteer shifts", "covered"))),
    ("town museum", "month", ("curator", "conservator", "education officer", "chair of trustees",
                              "volunteer guide"),
     (("visitors", "counted"), ("objects", "catalogued"), ("school groups", "shown round"),
      ("loans", "returned"), ("postcards", "sold"))),
    ("amateur theatre company", "season", ("director", "stage manager", "lighting designer", "prompter",
                                           "wardrobe mistress"),
     (("tickets", "sold"), ("rehearsals", "held"), ("costumes", "sewn"), ("performances", "given"),
      ("programmes", "printed"))),
    ("swimming baths", "week", ("head lifeguard", "duty manager", "swimming teacher", "receptionist",
                                "plant engineer"),
     (("swimmers", "admitted"), ("lessons", "given"), ("lockers", "repaired"), ("incidents", "logged"),
      ("season tickets", "renewed"))),
    ("repair café", "month", ("electrician", "seamstress", "bike mechanic", "organiser", "greeter"),
     (("items", "brought in"), ("lamps", "mended"), ("bicycles", "fixed"), ("toasters", "rescued"),
      ("cups of tea", "poured"))),
    ("cycling club", "month", ("ride leader", "club secretary", "club mechanic", "club captain",
                               "membership officer"),
     (("members", "enrolled"), ("rides", "led"), ("punctures", "fixed"), ("new riders", "welcomed"),
      ("jerseys", "ordered"))),
    ("parish choir", "term", ("choirmaster", "organist", "music librarian", "head chorister", "treasurer"),
     (("anthems", "learned"), ("services", "sung"), ("hymn books", "rebound"), ("concert tickets", "sold"),
      ("practices", "held"))),
    ("village bakery cooperative", "week", ("head baker", "shop manager", "delivery rider", "accounts clerk",
                                            "apprentice"),
     (("loaves", "baked"), ("orders", "taken"), ("cakes", "iced"), ("rounds", "delivered"),
      ("sacks of flour", "used"))),
)

OPENERS = (
    "This is the {period}ly report of the {Town} {org}.",
    "News from the {Town} {org}, for the {period} ending {date}.",
    "Minutes and news of the {Town} {org}, written up by the secretary.",
    "What follows is our report for the {period}; copies go to every member of the {Town} {org}.",
    "The {Town} {org}: a report on the last {period}.",
)
# Report sentences about the organisation that answer no question: the document's connective tissue.
FILLER = (
    "Rain on {day} kept the numbers down, but the rest of the {period} was busy.",
    "The heating failed again on {day}, and we worked in coats until the afternoon.",
    "Thanks go to everyone who stayed late to tidy up after the open day.",
    "The next meeting is on {day} at {hour} o'clock in the back room.",
    "We are still looking for help on {day} mornings; please ask at the door.",
    "A reminder that subscriptions are due by {date}.",
    "The new signs by the gate have made the place much easier to find.",
    "{visitor} from the {Town2} paper came to take photographs for a short article.",
    "Our thanks to {visitor}, who lent us a trailer for the day.",
    "The roof over the store was patched on {day}, at last.",
    "Several people have asked about parking; the field behind the hall may be used on {day}s.",
    "The committee met for {hours} hours on {day} and agreed the budget for the next {period}.",
    "We were open for {hours} extra hours over the holiday.",
    "A lost umbrella and a blue scarf are waiting to be collected.",
    "The raffle raised a little more than last time, and the cake stall sold out by noon.",
    "A letter of thanks arrived from the {Town2} council.",
    "We hope to put up a noticeboard by the door before the end of the {period}.",
    "The tea urn has been replaced, after {years} years of faithful service.",
    "Please return borrowed tools to the shed; several are still missing.",
    "It was a quieter {period} than most, which gave us time to catch up on repairs.",
    "On {day} the water was off for an hour while the pipes were checked.",
    "Our website now lists the opening times for the whole year.",
    "{visitor} wrote to say how welcome she had been made on her first visit.",
    "Everyone who came to the summer party agreed that the music was the best part.",
    "The accounts for the last {period} have been checked and are available on request.",
    "We said goodbye to the old van on {day}; it had done {years} years of work for us.",
    "A school from {Town2} asked whether they could visit in {month}, and we said yes.",
    "There is a sign-up sheet on the board for anyone who can give an hour or two.",
    "The storeroom has been cleared, and the shelves are labelled for the first time.",
    "We had hoped to finish the painting by {date}, but it will take another {period}.",
    "The lights in the hall were changed for brighter ones, and nobody misses the old ones.",
    "Coffee mornings will carry on through {month}, every {day} from ten.",
    "The gutters were cleared on {day} before the forecast storm, which never came.",
    "There were more new faces this {period} than we can remember, many of them from {Town2}.",
    "The bus from {Town2} now stops at the corner, which has helped those without a car.",
    "Insurance for the coming year has been renewed at the same price as before.",
    "A reader asked why the doors now open later on {day}s: it is to give the cleaners time.",
    "The fire alarm was tested on {day}, and everyone was out in under four minutes.",
    "{visitor} has offered to give a talk in {month}; details will follow.",
    "Thank you to the family who left a box of books and a kettle on the step.",
    "We are sorry that the {day} session had to be cancelled at short notice.",
    "The garden bench outside has been sanded and oiled, ready for the summer.",
    "Two long tables were bought second-hand from a school in {Town2}.",
    "The first aid box has been restocked, and the list of contents is inside the lid.",
    "A reminder to switch off the lights and lock the side door when you leave.",
    "The notice about the car park has been taken down, since the problem is solved.",
)
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")

ROLE_LINES = (  # {r} the role, {n} the person
    "Our {r}, {n}, asked me to thank everyone who helped this {period}.",
    "{n}, the {r}, has agreed to carry on for another year.",
    "We welcome {n} as our new {r}.",
    "As {r}, {n} will be the person to ask about anything to do with that side of things.",
    "Questions for the {r} should go to {n}, who is in most afternoons.",
    "The {r} this {period} was {n}, who also opened up every morning.",
    "{n} took over as {r} at the start of the {period} and has already made changes.",
    "The {r} - {n}, for anyone who has not met her yet - would like more volunteers.",
    "We are lucky in our {r}. {n} has done the job for years without complaint.",
    "The {r} spoke at the meeting about next year's plans. That was {n}, who joined us from {Town2}.",
)
COUNT_LINES = (  # {k} the number, {t} the things, {v} the verb
    "{k} {t} were {v} this {period}.",
    "This {period}, {k} {t} were {v}.",
    "In all, {k} {t} were {v} over the {period}, {cmp} last {period}.",
    "By the end of the {period} the number of {t} {v} had reached {k}.",
    "The tally of {t} {v} this {period} came to {k}.",
)
_CMP = ("up on", "down on", "about the same as", "well ahead of")
PART_LINES = (  # {p} one person's part of the asked count, {n2} that person (no role)
    " Of those, {p} were {v} by {n2}.",
    " {n2} alone accounted for {p} of them.",
    " The most by any one person, {p}, were {v} by {n2}.",
)
LAST_LINES = (
    "Last {period}, {k} {t} were {v}.",
    "For comparison, the figure for last {period} was {k} {t}.",
)
ROLE_QUESTIONS = ("Who is the {r}?", "Who is the {r} of the {org}?", "What is the name of the {r}?",
                  "Which person is the {r}?")
COUNT_QUESTIONS = ("How many {t} were {v} this {period}?", "What number of {t} were {v} this {period}?",
                   "How many {t} does the report say were {v} this {period}?")
PART_QUESTIONS = ("How many {t} were {v} by {n2}?", "How many of the {t} did {n2} account for?")
LAST_QUESTIONS = ("How many {t} were {v} last {period}?", "What was last {period}'s figure for {t} {v}?")


def _numbers(rng: random.Random, n: int, lo: int = 12, hi: int = 980) -> list[int]:
    """n distinct numbers none of whose digits contain another's (sub_em must tell them apart)."""
    out: list[int] = []
    while len(out) < n:
        k = rng.randint(lo, hi)
        if all(str(k) not in str(o) and str(o) not in str(k) for o in out):
            out.append(k)
    return out


def report_fact(rng: random.Random):
    """(gold sentences, distractor sentences, question, answers, subject, opening line, filler stream) for one
    report; the opening line is the document's first line (prose_fact gives it to the layout as its title)."""
    org, period, roles_all, things_all = rng.choice(ORGS)
    town, town2 = rng.sample(_TOWNS, 2)
    roles = rng.sample(roles_all, rng.randint(2, 5))
    things = rng.sample(things_all, rng.randint(2, 4))
    names = rng.sample([f"{f} {l}" for f in rng.sample(_FIRST, 10) for l in rng.sample(_LAST, 6)], len(roles) + 3)
    people, part_person, visitors = names[:len(roles)], names[len(roles)], names[len(roles) + 1:]
    numbers = _numbers(rng, len(things) + 1)
    counts, last = numbers[:len(things)], numbers[len(things)]
    part = max(2, counts[0] // rng.randint(3, 9))  # one person's part of the asked total
    if any(str(part) in str(o) or str(o) in str(part) for o in numbers):
        part = None  # a part that reads inside another number would make two right answers
    fill = dict(period=period, org=org, Town=town, Town2=town2, cmp=rng.choice(_CMP))

    role_lines = [_cap(rng.choice(ROLE_LINES).format(r=r, n=n, **fill)) for r, n in zip(roles, people)]
    count_lines = [_cap(rng.choice(COUNT_LINES).format(k=k, t=t, v=v, **fill)) for k, (t, v) in zip(counts, things)]
    t0, v0 = things[0]
    ask = rng.random()
    if ask < 0.5:  # a person by role
        gold, distract = role_lines[:1], role_lines[1:] + count_lines
        question, answers, subject = rng.choice(ROLE_QUESTIONS).format(r=roles[0], org=org), (people[0],), roles[0]
    else:  # a count: this period (the total), one person's part, or last period
        kind = "total" if ask < 0.75 or part is None else ("part" if ask < 0.875 else "last")
        unit = count_lines[0]
        if part is not None and (kind == "part" or rng.random() < 0.5):
            unit += rng.choice(PART_LINES).format(p=part, n2=part_person, v=v0)
        last_line = _cap(rng.choice(LAST_LINES).format(k=last, t=t0, v=v0, **fill))
        q = dict(t=t0, v=v0, n2=part_person, **fill)
        if kind == "last":
            gold, distract = [last_line], [unit] + count_lines[1:]
            question, answers = rng.choice(LAST_QUESTIONS).format(**q), (str(last),)
        else:
            gold = [unit]
            distract = count_lines[1:] + ([last_line] if rng.random() < 0.5 else [])
            if kind == "part":
                question, answers = rng.choice(PART_QUESTIONS).format(**q), (str(part),)
            else:
                question, answers = rng.choice(COUNT_QUESTIONS).format(**q), (str(counts[0]),)
        distract += role_lines
        subject = None
    rng.shuffle(distract)
    avoid = set(answers)
    opener = rng.choice(OPENERS).format(date=_date(rng), **fill)
    while any(a in opener for a in avoid):
        opener = rng.choice(OPENERS).format(date=_date(rng), **fill)
    return gold, distract, question, answers, subject, opener, _report_filler(rng, fill, visitors, avoid)


def _report_filler(rng: random.Random, fill: dict, visitors: list[str], avoid: set):
    """An endless stream of (sentence, separator) about the organisation. A sentence that would contain an
    answer (a number of hours or years equal to the asked count) is drawn again."""
    order = list(range(len(FILLER)))
    rng.shuffle(order)
    i = 0
    while True:
        s = FILLER[order[i % len(order)]].format(day=rng.choice(_DAYS), hour=rng.randint(2, 8),
                                                 hours=rng.randint(2, 14), years=rng.randint(5, 40),
                                                 date=_date(rng), month=rng.choice(_MONTHS),
                                                 visitor=rng.choice(visitors), **fill)
        i += 1
        if i % len(order) == 0:
            rng.shuffle(order)
        if not any(a in s for a in avoid):
            yield _cap(s), ("\n\n" if rng.random() < 0.2 else " ")


def _date(rng: random.Random) -> str:
    return f"{rng.randint(1, 28)} {rng.choice(_MONTHS)}"
