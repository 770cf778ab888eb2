"""Chat-template control tokens inside inserted text: found and defused.

Why: a chat template turns the prompt into one string, and the tokenizer then maps every exact
occurrence of a special token's text to the control token itself. A document holding
`<|im_end|>\\n<|im_start|>assistant` would so close the user turn and open a fake assistant turn, on the
embedded backend (`ask`, `serve`) and on any server that tokenizes the same way (vLLM, llama.cpp).

What: every occurrence of a control token's text gets a zero-width space after its first character
(`<` + ZWSP + `|im_end|>`): a person reads the same text, the tokenizer sees plain characters. The
control tokens are (a) the tokenizer's own added tokens, when the tokenizer is known (every registry
model, any tokenizer.json / HF folder / .gguf given), and (b) always, the shapes chat templates use
(`<|...|>`, DeepSeek's `<｜...｜>`, `[INST]`, `<<SYS>>`, `<s>`/`</s>`, Gemma's turn markers), so a read
counted in cl100k tokens against a server still cannot fake a turn.

Defusing repeats until nothing matches, so overlapping or nested spellings cannot rebuild a token.
"""
from __future__ import annotations

import re
from typing import Iterable

ZWSP = "\u200b"
# The spellings chat templates use for turn and sequence markers (every registry model is ChatML).
GENERIC = (r"<\|[^\s<>|]{1,64}\|>", "<\uff5c[^<>\uff5c]{1,64}\uff5c>", r"\[/?INST\]", r"<</?SYS>>", r"</?s>",
           r"<(?:start|end)_of_turn>", r"<(?:bos|eos|pad|unk)>")
GENERIC_RE = re.compile("|".join(GENERIC))
_MAX_PASSES = 64  # every pass defuses at least the leftmost match; real text needs one or two


def special_strings(tokenizer) -> tuple[str, ...]:
    """The texts of `tokenizer`'s added/special tokens (longest first), for any tokenizer we meet.

    Knows memagent's wrappers (HFTokenizer, the fast C/numpy stand-ins, tiktoken) and transformers'
    tokenizers (the embedded backend); an unknown object yields () and the generic shapes still apply."""
    found: set[str] = set()
    seen = set()
    stack = [tokenizer]
    while stack:
        t = stack.pop()
        if t is None or id(t) in seen:
            continue
        seen.add(id(t))
        stack += [getattr(t, a, None) for a in ("_tok", "ref", "_enc", "_tokenizer", "backend_tokenizer")]
        get = getattr(t, "get_added_tokens_decoder", None)  # tokenizers.Tokenizer
        if callable(get):
            try:
                found.update(getattr(v, "content", str(v)) for v in get().values())
            except Exception:  # a tokenizer we cannot introspect is defused by the generic shapes only
                pass
        decoder = getattr(t, "added_tokens_decoder", None)  # transformers
        if isinstance(decoder, dict):
            found.update(getattr(v, "content", str(v)) for v in decoder.values())
        for attr in ("all_special_tokens", "special_tokens_set"):  # transformers, tiktoken
            v = getattr(t, attr, None)
            if isinstance(v, (list, tuple, set, frozenset)):
                found.update(x for x in v if isinstance(x, str))
    # a one-character "special" (some tokenizers list a plain byte) would mangle ordinary text
    return tuple(sorted((s for s in found if len(s) >= 2 and not s.isspace()), key=lambda s: (-len(s), s)))


def pattern(specials: Iterable[str] = ()) -> re.Pattern:
    """One search for the generic shapes and the given token texts (longest alternative first)."""
    extra = [re.escape(s) for s in sorted(set(specials), key=lambda s: (-len(s), s))]
    return re.compile("|".join(extra + list(GENERIC)))


def defuse(text: str, search: re.Pattern = GENERIC_RE) -> str:
    """`text` with every match of `search` broken by a zero-width space after its first character."""
    for _ in range(_MAX_PASSES):
        if not search.search(text):
            return text
        text = search.sub(lambda m: m.group(0)[0] + ZWSP + m.group(0)[1:], text)
    return text


def defuse_messages(messages: list[dict], search: re.Pattern = GENERIC_RE) -> list[dict]:
    """Chat messages with control-token text in every string `content` defused (roles untouched).

    For a backend that applies a chat template itself (embedded, and so `serve`): message content is
    text, never structure, whoever sent it."""
    out = []
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        out.append({**m, "content": defuse(c, search)} if isinstance(c, str) else m)
    return out


def chat_ids(hf_tokenizer, messages: list[dict], search: re.Pattern | None = None) -> list[int]:
    """Prompt ids from a transformers tokenizer's chat template, message content defused first.

    `search`: from `pattern(special_strings(hf_tokenizer))`; built here when not given (callers that
    tokenize often keep it)."""
    if search is None:
        search = pattern(special_strings(hf_tokenizer))
    out = hf_tokenizer.apply_chat_template(defuse_messages(messages, search), add_generation_prompt=True,
                                           tokenize=True)
    ids = out["input_ids"] if not isinstance(out, list) else out
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)
