"""Prompt templates as data, safe rendering, and answer extraction.

Templates live in `memagent/templates/*.toml` (one place; users pass `--template FILE` for their own,
e.g. the wording a released checkpoint was trained with). A template has an update prompt with
{question} {memory} {chunk}, a final prompt with {question} {memory}, and the empty-memory marker.
Optionally, for the early-exit gate (memagent/gates.py): `update_exit`, an update prompt that also
tells the model to end its memory with the `exit_marker` line once the memory answers the question.

Why rendering is not `str.format`: a document may contain "{memory}" or "</section>". Placeholders are
substituted in one pass (inserted text is never scanned again), and any of the template's own markers
(<tag>, </tag>, cue lines such as "Updated memory:") that appear inside inserted text are neutralised, so
document text cannot close the section early, open a fake memory block, or overwrite the question.
Chat-template control tokens (`<|im_end|>` ...) in inserted text are defused too (memagent/specials.py),
so a document cannot end the user turn and fake an assistant turn either.
"""
from __future__ import annotations

import hashlib
import os
import re
import tomllib
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

from .specials import GENERIC_RE, defuse

PLACEHOLDER = re.compile(r"\{(question|memory|chunk)\}")
TAG = re.compile(r"</?\s*([A-Za-z_][\w-]*)\s*>")
ZWSP = "\u200b"  # invisible to a reader, breaks an exact match of a marker


class TemplateError(ValueError):
    pass


@dataclass(frozen=True)
class Template:
    name: str
    update: str
    final: str
    empty_memory: str
    system: str | None = None
    update_exit: str | None = None  # the update prompt when the early-exit gate is on
    exit_marker: str | None = None  # the line that prompt asks for once the memory answers the question

    @cached_property  # in every request's cache key: hashed once per template
    def digest(self) -> str:
        """Identifies the wording in state files: resuming with a different template is refused.

        The exit wording is left out on purpose, so that adding it kept every earlier digest (and state
        file) valid; a read with the exit gate on records `exit_digest` in its settings instead."""
        h = hashlib.sha256("\x00".join([self.update, self.final, self.empty_memory, self.system or ""]).encode())
        return h.hexdigest()[:16]

    @property
    def exit_digest(self) -> str:
        h = hashlib.sha256("\x00".join([self.update_exit or "", self.exit_marker or ""]).encode())
        return h.hexdigest()[:16]

    @cached_property  # rendered into every prompt: computed once per template, not per call
    def tag_names(self) -> set[str]:
        return {m.group(1).lower() for m in TAG.finditer(self.update + self.final + (self.update_exit or ""))}

    @cached_property
    def cue_lines(self) -> list[str]:
        """Non-empty lines outside placeholders that end in ':' (e.g. 'Updated memory:')."""
        cues = []
        for text in (self.update, self.final, self.update_exit or ""):
            for line in text.splitlines():
                s = line.strip()
                if s.endswith(":") and len(s) < 60 and "{" not in s:
                    cues.append(s)
        return cues

    def __post_init__(self):
        for field, text, need in (("update", self.update, {"question", "memory", "chunk"}),
                                  ("final", self.final, {"question", "memory"})):
            have = set(PLACEHOLDER.findall(text))
            if not need <= have:
                missing = ", ".join("{" + n + "}" for n in sorted(need - have))
                raise TemplateError(f"template {self.name!r}: the {field} prompt lacks {missing}")
        if not self.empty_memory.strip():
            raise TemplateError(f"template {self.name!r}: empty_memory must not be blank")
        if (self.update_exit is None) != (self.exit_marker is None):
            raise TemplateError(f"template {self.name!r}: update_exit and exit_marker go together")
        if self.update_exit is not None:
            missing = {"question", "memory", "chunk"} - set(PLACEHOLDER.findall(self.update_exit))
            if missing:
                raise TemplateError(f"template {self.name!r}: the update_exit prompt lacks "
                                    + ", ".join("{" + n + "}" for n in sorted(missing)))
            if not self.exit_marker.strip() or self.exit_marker.strip() not in self.update_exit:
                raise TemplateError(f"template {self.name!r}: exit_marker must be non-blank and quoted in "
                                    "update_exit (the model has to be told what to write)")


def builtin_templates() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("memagent.templates").iterdir() if p.name.endswith(".toml"))


def load_template(name_or_path: str) -> Template:
    """A built-in name ('notes', 'memagent') or a path to a .toml/.json file with the same keys.

    A built-in name wins over a file of that name in the current folder (a stray `notes` file must not
    replace the template silently); a path is meant when it is clearly one: it has a folder part or a
    .toml/.json suffix (`./notes`, `notes.toml`)."""
    p = Path(name_or_path).expanduser()
    path_like = os.sep in name_or_path or "/" in name_or_path or p.suffix.lower() in (".toml", ".json")
    if name_or_path in builtin_templates() and not path_like:
        p = None
    if p is not None and p.is_file():
        try:
            raw = p.read_bytes()
            data = tomllib.loads(raw.decode("utf-8")) if p.suffix != ".json" else __import__("json").loads(raw)
        except Exception as e:
            raise TemplateError(f"cannot parse template {p}: {' '.join(str(e).split())}") from None
        if not isinstance(data, dict):
            raise TemplateError(f"template {p} must be a table/object of text fields, not a {type(data).__name__}")
        data.setdefault("name", p.stem)
    elif name_or_path in builtin_templates():
        data = tomllib.loads((resources.files("memagent.templates") / f"{name_or_path}.toml").read_text())
    else:
        raise TemplateError(f"template {name_or_path!r} is neither a file nor one of: {', '.join(builtin_templates())}")
    unknown = set(data) - {"name", "update", "final", "empty_memory", "system", "update_exit", "exit_marker"}
    if unknown:
        raise TemplateError(f"template {name_or_path}: unknown keys {sorted(unknown)}")
    for key in ("update", "final", "empty_memory"):
        if not isinstance(data.get(key), str):
            raise TemplateError(f"template {name_or_path}: missing text field {key!r}")
    for key in ("name", "system", "update_exit", "exit_marker"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise TemplateError(f"template {name_or_path}: field {key!r} must be text")
    return Template(**data)


def neutralise(text: str, template: Template, extra: tuple[str, ...] = (), specials: re.Pattern | None = None) -> str:
    """Defuse the template's own markers inside inserted text; everything else is left as is.

    `extra`: further markers to defuse (the exit marker, when the exit gate is on: a document must not
    be able to make the model stop reading by carrying the marker for it to copy).
    `specials`: the tokenizer's control tokens (memagent.specials.pattern); without it the generic
    chat-template shapes (`<|im_end|>` ...) are still defused, so inserted text can never end a turn."""
    text = defuse(text, specials if specials is not None else GENERIC_RE)
    names = template.tag_names

    def fix_tag(m: re.Match) -> str:
        if m.group(1).lower() not in names:
            return m.group(0)
        return m.group(0).replace("<", "\u2039").replace(">", "\u203a")  # ‹tag› reads the same to a person

    text = TAG.sub(fix_tag, text)
    for cue in template.cue_lines:
        if cue in text:
            text = text.replace(cue, cue[0] + ZWSP + cue[1:])
    for marker in (m.strip() for m in extra if m.strip()):  # matched case-blind, as the reader finds it
        text = re.sub(re.escape(marker), lambda m: m.group(0)[0] + ZWSP + m.group(0)[1:], text, flags=re.I)
    for ph in ("{question}", "{memory}", "{chunk}"):
        if ph in text:  # harmless with one-pass rendering, but a user's own template tool may re-render
            text = text.replace(ph, "{" + ZWSP + ph[1:])
    return text


def render(text: str, template: Template, extra_markers: tuple[str, ...] = (), *, specials: re.Pattern | None = None,
           **values: str) -> str:
    safe = {k: neutralise(v, template, extra_markers, specials) for k, v in values.items()}
    return PLACEHOLDER.sub(lambda m: safe[m.group(1)], text)


def to_messages(template: Template, user: str) -> list[dict]:
    msgs = [{"role": "system", "content": template.system}] if template.system else []
    return msgs + [{"role": "user", "content": user}]


def strip_reasoning(reply: str) -> str:
    """Reasoning models think first; only what follows the last </think> is the memory or answer."""
    i = reply.rfind("</think>")
    return reply[i + len("</think>"):] if i >= 0 else reply


_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_boxed(reply: str) -> str | None:
    """Content of the last \\boxed{...} (braces balanced), or None when there is none."""
    starts = [m.end() for m in _BOX.finditer(reply)]
    if not starts:
        return None
    start, depth = starts[-1], 1
    for i in range(start, len(reply)):
        depth += {"{": 1, "}": -1}.get(reply[i], 0)
        if depth == 0:
            return reply[start:i].strip()
    return reply[start:].strip()  # unbalanced: the reply was cut off inside the box; take what is there


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mbox)\s*\{(.*)\}", re.S)


def unwrap_text(answer: str) -> str:
    """`\\text{Atlantic}` -> `Atlantic`: models trained on maths write a worded answer as LaTeX text
    inside the box (round 26's step made it most answers), and a user asked a question wants the words.
    Only a wrapper around the whole answer is removed, and only when its braces pair up inside it."""
    while (m := _TEXT_WRAP.fullmatch(answer.strip())):
        depth = 0
        for ch in m.group(1):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth < 0:  # "\\text{a} and \\text{b}": two wrappers, not one
                return answer.strip()
        if depth:
            return answer.strip()
        answer = m.group(1)
    return answer.strip()


def extract_answer(reply: str) -> str:
    reply = strip_reasoning(reply)
    boxed = extract_boxed(reply)
    return unwrap_text(boxed) if boxed is not None else reply.strip()
