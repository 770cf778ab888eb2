"""One flat, documented training config: the dataclass below *is* the config file's schema.

Why flat: a TOML/YAML file, the CLI flags and this dataclass have the same keys (TRL's names where TRL
has the concept), so `memagent train --config a.toml --learning-rate 1e-5` overrides exactly one line of
the file, and a saved run's `config.json` can be fed back in unchanged. Unknown keys are an error (a typo
must not silently train with a default).

Defaults follow the released MemAgent recipe where it made a choice (no std division of advantages,
KL 0.001 with the k3 "low_var_kl" estimator, token-mean "dapo" loss, clip 0.2/0.2, lr 1e-6 with warmup,
truncated memory updates kept in the loss, AdamW with weight decay 0.01 and grad clip 1.0), except in
four places, each with the release's behaviour one option away:
* `trajectory_weight="equal"` (release: "tokens"). The original token-mean over all conversations lets a
  document with more chunks weigh more in the update; here every trajectory carries the same weight.
* `dynamic_sampling=True` (release: False; the release never enables DAPO's group filter). On a small
  CPU batch an all-equal group carries no gradient at all, so we refill instead of wasting the step.
* `num_mini_batches=1` (release: 16 optimizer steps per rollout batch, which is when the clip binds), and
  with more than one, `mini_batch_norm="batch"` scales each mini-batch against the whole batch's
  counts; the release's `mini_batch_norm="mini_batch"` makes each mini-batch its own token-mean.
* `clip_ratio_c=None`: no dual-clip (release: 3.0 — negative-advantage tokens capped at -3A).
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path


class ConfigError(ValueError):
    pass


# The prose fact shapes rl/notes_prose.py can draw; one list for the config's check and the generator's.
# role_split (a role named a sentence before its person, among other names), role_told (the same after a
# role sentence that sounds finished), role_handover (a post passing between two people), attr_dated (one
# value per day, one day asked), report (a whole document about one organisation, rl/notes_report.py) and
# roster (such a report whose asked person has look-alikes of the same kind, rl/notes_roster.py) and
# paraphrase (an event told in none of its question's words, rl/notes_paraphrase.py) are drawn only when
# asked for.
NOTES_PROSE_SHAPES = ("attr", "role", "extreme", "role_split", "role_told", "role_handover", "attr_dated",
                      "report", "roster", "paraphrase")
NOTES_DEFAULT_SHAPES = ("attr", "role", "extreme")


@dataclass
class TrainConfig:
    # --- policy model -------------------------------------------------------------------------------
    model: str = "smollm2-135m"  # registered name (memagent.models) or a path to an HF folder
    dtype: str = "float32"  # float32 | bfloat16 | float16 (CUDA only for 16-bit training)
    device: str = "auto"  # auto | cpu | cuda | cuda:N (torchrun: each rank takes cuda:LOCAL_RANK)
    use_peft: bool = False  # LoRA adapters instead of a full fine-tune (TRL: use_peft)
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    lora_last_layers: int = 0  # adapt only the last N decoder layers (0 = all): backward stops below them
    init_adapter: str = ""  # start LoRA from this adapter folder (save_pretrained), e.g. the SFT stage's final/
    gradient_checkpointing: bool = False
    fsdp: bool = False  # torchrun only: shard weights, grads and Adam state over ranks (FSDP2) instead of replicating them (rl/dist.py)
    # --- task and reading workflow -------------------------------------------------------------------
    task: str = "kv"  # kv (key->value facts in filler, NIAH-like) | hotpotqa (RULER-HotpotQA-like) | charkv (tiny tests)
    #   | notes (rl/notes_data.py: mixed needles, look-alike keys, haystacks and train-split QA; 1..num_chunks chunks)
    template: str = "notes"  # built-in prompt template name or a template file (memagent.prompts)
    num_chunks: int = 3  # chunks per training document (task notes: the most; each document draws 1..num_chunks)
    chunk_tokens: int = 128  # model tokens per chunk
    chunk_snap: int = 0  # task hotpotqa: chunks end at a line/sentence end within their last N tokens (ask --chunk-snap)
    #   (kv and notes documents are packed from whole facts and sentences already: no boundary cuts one)
    num_distractors: int = 2  # other key->value facts planted in the document (kv task)
    notes_qa_share: float = 0.25  # task notes: share of document-QA samples (SQuAD/HotpotQA train halves)
    notes_qa_context_share: float = 0.0  # task notes: share of those asked over whole paragraphs (SQuAD train half)
    notes_prose_share: float = 0.0  # task notes: share of facts told in prose (rl/notes_prose.py); rest: needles
    notes_prose_noise: float = 0.0  # task notes: share of prose facts set in RULER's repeated noise sentences
    notes_late_share: float = 0.0  # task notes: share of 2+ chunk documents with all evidence in the last chunk
    notes_early_share: float = 0.0  # task notes: share of 2+ chunk documents with evidence first, look-alikes after
    notes_prose_shapes: list = field(default_factory=lambda: list(NOTES_DEFAULT_SHAPES))  # task notes: shapes drawn
    notes_needle_essay_share: float = 0.0  # task notes: share of needle documents whose haystack is essay prose
    notes_decoy_share: float = 0.0  # task notes: share of needle documents with answer-sounding decoy sentences
    notes_title_share: float = 0.0  # task notes: share of documents that open with a title line (a look-alike)
    notes_title_word_share: float = 0.0  # task notes: share of subject titles naming only its last word
    notes_words_share: float = 0.0  # task notes: share of prose facts whose counts (1-999) are written in words
    notes_the_opening_share: float = 0.0  # task notes: share of documents whose every chunk after the first opens with "The ..."
    notes_the_first_share: float = 0.0  # task notes: of those, the share read from mid-text: untitled, the first chunk opens so too
    notes_min_chunks: int = 1  # task notes: the fewest chunks a document draws (more: evidence later, empty turns first)
    kv_values: str = "number"  # kv task values: number (4 digits, "access code") | word ("password")
    memory_tokens: int = 64  # cap of every memory update (max_completion_length of update turns)
    answer_tokens: int = 24  # cap of the final answer turn
    reward: str = "sub_em"  # sub_em (normalised substring, MemAgent's eval metric) | boxed_em (strict \boxed{} exact match)
    format_reward: float = 0.0  # added when the final reply contains \boxed{...}; 0 = off
    length_penalty: float = 0.0  # subtracted per trajectory when any of its turns hit its cap; 0 = off
    # Weight of a per-update signal added to each memory update's advantage: do the notes it wrote hold a
    # gold answer, against the group's other reads of the same chunk (advantage.update_advantages).
    # 0 = off, the seed's final-answer-only reward. Not in MemAgent: it reads the gold while training.
    update_reward: float = 0.0
    # --- rollout -------------------------------------------------------------------------------------
    backend: str = "embedded"  # embedded (the policy itself, shared weights) | openai (server; see rl/remote.py)
    backend_url: str = ""  # for backend=openai
    questions_per_step: int = 4  # distinct questions per step, across all ranks (prompts per batch)
    num_generations: int = 8  # G trajectories per question (TRL: num_generations; original: rollout.n=16)
    temperature: float = 1.0
    top_p: float = 1.0
    rollout_max_batch: int = 32  # rows the embedded backend decodes together
    dynamic_sampling: bool = True  # DAPO: drop groups whose rewards are all equal, refill with new questions
    max_resample_rounds: int = 3  # extra rollout rounds allowed per step to refill (DAPO: max_num_gen_batches)
    # Step 1's rollout batch read from files instead of sampled: rollouts.jsonl(.gz) that `memagent rft`
    # collected with the starting policy (init_adapter); every group in them at once (engine.first_step).
    first_step_rollouts: list = field(default_factory=list)
    # --- objective -----------------------------------------------------------------------------------
    loss_type: str = "dapo"  # dapo (token-mean) | grpo (sequence-mean) | dr_grpo (constant normaliser)
    trajectory_weight: str = "equal"  # equal (each trajectory weighs the same) | tokens (original: long docs weigh more)
    scale_rewards: str = "none"  # none (original recipe: A = R - mean) | group (÷ group std) | batch (÷ batch std)
    epsilon: float = 0.2  # lower clip of the ratio (1 - epsilon)
    epsilon_high: float | None = None  # upper clip (1 + epsilon_high); None = epsilon. DAPO's clip-higher: 0.28
    beta: float = 0.001  # KL coefficient to the reference policy; 0 = no reference model, no KL forward
    kl_estimator: str = "k3"  # k3 (= verl low_var_kl, clamped to [-10, 10]) | k1 | k2
    # Turns cut at their cap (no EOS) contribute no tokens to the loss when True. Default False = the
    # original recipe (truncated memories kept and trained as-is); with a small memory cap most updates
    # of a small model hit it, and masking them would train only the answer turn.
    mask_truncated_completions: bool = False
    # --- optimisation --------------------------------------------------------------------------------
    learning_rate: float = 1e-6
    lr_scheduler_type: str = "constant_with_warmup"  # constant_with_warmup | linear | cosine
    warmup_steps: int = 20
    weight_decay: float = 0.01
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    max_steps: int = 100  # 0: memagent rft only collects (memagent train then reads them: first_step_rollouts)
    num_iterations: int = 1  # optimisation passes over each rollout batch (TRL: num_iterations, "mu")
    num_mini_batches: int = 1  # optimizer steps per pass; >1 makes later ones off-policy (old log-probs recomputed)
    mini_batch_norm: str = "batch"  # batch (one normaliser, each mini-batch x M) | mini_batch (the release: own token-mean)
    clip_ratio_c: float | None = None  # dual-clip cap for negative advantages (release 3.0); None = off
    max_tokens_per_microbatch: int = 4096  # padded tokens per forward; bounds memory, not the maths
    sft_conversations_per_step: int = 8  # memagent sft: conversations per optimizer step (whole documents)
    sft_first_token_weight: float = 1.0  # memagent sft: loss weight of a note's first token (keep-or-drop decision)
    rft_questions: int = 64  # memagent rft: questions rolled out (G reads each, questions_per_step a round); 0: rft_rollouts only
    rft_groups: str = "any"  # memagent rft: any (every correct read) | mixed (only from groups where some read failed)
    rft_empty_turns: int = 0  # memagent rft: program-written "stay empty" turns added to each step (rl/rft.py)
    rft_rollouts: list = field(default_factory=list)  # memagent rft: earlier rollouts.jsonl(.gz) of init_adapter, kept from too
    max_nonfinite_steps: int = 3  # consecutive NaN/inf steps tolerated (each is skipped) before the run stops
    seed: int = 0
    # --- bookkeeping ---------------------------------------------------------------------------------
    output_dir: str = "runs/train"
    save_steps: int = 0  # 0 = only at the end
    resume: bool = True  # continue from output_dir/checkpoint if one exists
    torch_threads: int = 0  # 0 = leave torch's default
    progress: bool = True

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        def one_of(name, allowed):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")

        one_of("loss_type", ("dapo", "grpo", "dr_grpo"))
        one_of("trajectory_weight", ("equal", "tokens"))
        one_of("scale_rewards", ("none", "group", "batch"))
        one_of("kl_estimator", ("k1", "k2", "k3"))
        one_of("reward", ("sub_em", "boxed_em"))
        one_of("task", ("kv", "hotpotqa", "charkv", "notes"))
        one_of("kv_values", ("number", "word"))
        one_of("backend", ("embedded", "openai"))
        one_of("lr_scheduler_type", ("constant_with_warmup", "linear", "cosine"))
        one_of("dtype", ("float32", "bfloat16", "float16"))
        one_of("mini_batch_norm", ("batch", "mini_batch"))
        one_of("rft_groups", ("any", "mixed"))
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1:
            raise ConfigError(f"clip_ratio_c must be > 1 (the release uses 3.0), got {self.clip_ratio_c}")
        for name in ("num_chunks", "chunk_tokens", "memory_tokens", "answer_tokens", "questions_per_step",
                     "num_generations", "num_iterations", "num_mini_batches",
                     "max_tokens_per_microbatch"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.chunk_snap < self.chunk_tokens:
            raise ConfigError(f"chunk_snap must be from 0 to chunk_tokens - 1, got {self.chunk_snap}")
        if self.chunk_snap and self.task != "hotpotqa":
            raise ConfigError("chunk_snap is for task hotpotqa: kv and notes documents are already packed from whole "
                              "sentences and facts")
        if self.max_steps < 0:
            raise ConfigError(f"max_steps must be >= 0 (0: memagent rft only collects), got {self.max_steps}")
        if not 0 <= self.epsilon < 1 or (self.epsilon_high is not None and self.epsilon_high < 0):
            raise ConfigError("epsilon must be in [0, 1) and epsilon_high >= 0")
        if not (0 <= self.notes_qa_share and 0 <= self.notes_prose_share
                and self.notes_qa_share + self.notes_prose_share <= 1):
            raise ConfigError("notes_qa_share and notes_prose_share must be >= 0 and sum to at most 1")
        if self.rft_questions < 0 or (self.rft_questions == 0 and not self.rft_rollouts):
            raise ConfigError(f"rft_questions must be positive (0 only with rft_rollouts), got {self.rft_questions}")
        if self.rft_empty_turns < 0 or (self.rft_empty_turns and self.num_chunks < 2):
            raise ConfigError(f"rft_empty_turns must be >= 0 (> 0 needs num_chunks >= 2), got {self.rft_empty_turns}")
        if not 1 <= self.notes_min_chunks <= self.num_chunks:
            raise ConfigError(f"notes_min_chunks must be in [1, num_chunks], got {self.notes_min_chunks}")
        if not self.notes_prose_shapes or set(self.notes_prose_shapes) - set(NOTES_PROSE_SHAPES):
            raise ConfigError(f"notes_prose_shapes must be a non-empty subset of {', '.join(NOTES_PROSE_SHAPES)}, "
                              f"got {list(self.notes_prose_shapes)}")
        if self.notes_early_share + self.notes_late_share > 1:
            raise ConfigError("notes_early_share and notes_late_share share one draw and must sum to at most 1")
        for name in ("notes_prose_noise", "notes_late_share", "notes_early_share", "notes_needle_essay_share",
                     "notes_decoy_share", "notes_title_share", "notes_title_word_share", "notes_qa_context_share",
                     "notes_words_share", "notes_the_opening_share", "notes_the_first_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.sft_first_token_weight <= 0:
            raise ConfigError(f"sft_first_token_weight must be positive, got {self.sft_first_token_weight}")
        if self.update_reward < 0:
            raise ConfigError(f"update_reward must be >= 0 (0 = off), got {self.update_reward}")
        if self.beta < 0:
            raise ConfigError(f"beta must be >= 0, got {self.beta}")
        if self.num_generations < 2 and self.dynamic_sampling:
            raise ConfigError("dynamic_sampling needs num_generations >= 2 (a group of one always has equal rewards)")

    def require_steps(self, command: str) -> None:
        """max_steps = 0 is valid only for `memagent rft` (collect only); the trainers refuse it rather than
        save an untouched adapter as a run's `final`."""
        if self.max_steps == 0:
            raise ConfigError(f"max_steps must be positive for {command} (0 means collect-only, for memagent rft)")

    @property
    def eps_high(self) -> float:
        return self.epsilon if self.epsilon_high is None else self.epsilon_high

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _field_types() -> dict[str, str]:
    return {f.name: str(f.type) for f in fields(TrainConfig)}


def coerce(name: str, value):
    """Turn a flag string (or a file value) into the field's type, with a one-line error."""
    types = _field_types()
    if name not in types:
        raise ConfigError(f"unknown config key {name!r}")
    t = types[name]
    if value is None:
        if "None" in t:
            return None
        raise ConfigError(f"{name} cannot be empty")
    try:
        if t.startswith("bool"):
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if t.startswith("int"):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if t.startswith("float"):
            if isinstance(value, str) and value.strip().lower() in ("none", ""):
                if "None" in t:
                    return None
            return float(value)
        if t.startswith("list"):
            return list(value) if isinstance(value, (list, tuple)) else [v.strip() for v in str(value).split(",") if v.strip()]
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: cannot read {value!r} as {t}") from None


def read_config_file(path: str | Path) -> dict:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        elif p.suffix == ".json":
            data = json.loads(text)
        else:
            raise ConfigError(f"config file must be .toml, .yaml or .json: {p}")
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"cannot parse {p}: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a table of key = value lines")
    nested = [k for k, v in data.items() if isinstance(v, dict)]
    if nested:
        raise ConfigError(f"{p}: the config is flat; move the keys of [{nested[0]}] to the top level")
    return data


def load_config(path: str | Path | None = None, overrides: dict | None = None) -> TrainConfig:
    """File values, then overrides (flags), each coerced to the field's type; unknown keys are errors."""
    raw: dict = {}
    if path:
        raw.update(read_config_file(path))
    raw.update({k: v for k, v in (overrides or {}).items() if v is not None})
    known = _field_types()
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(unknown)} (see memagent/rl/config.py)")
    return TrainConfig(**{k: coerce(k, v) for k, v in raw.items()})


def add_config_flags(parser) -> None:
    """One `--kebab-name VALUE` flag per field; unset flags (None) leave the file's value alone."""
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, dest=f"cfg_{f.name}", default=None, metavar=str(f.type).split(" ")[0].upper(),
                            help=argparse_help(f))


def argparse_help(f) -> str:
    default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return f"(default {default!r})"


def overrides_from_args(args) -> dict:
    return {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
