"""Fold a LoRA into the base GGUF's weights once, so llama.cpp reads one set of matrices per token.

Why: the llama.cpp engine applies an adapter at run time (two extra small matmuls per adapted matrix,
in f32), and the packaged Qwen2.5-Coder-0.5B GGUF stores most matrices as Q5_0 because its width (896)
is not a multiple of the K-quants' 256-wide blocks. On this project's 2-core AVX2 machine prompt
processing, which is most of a notes update (a 512-token chunk in, ~25 tokens out), ran at ~75 tokens/s
with the adapter applied; with the adapter folded in and every matrix stored as Q8_0 it ran at ~90-100
(benchmarks/bench_merged_weights.py measures it, with the reads' agreement).

What is written: every 2-D quantized matrix except the token embedding is dequantized, the adapter's
scale * B @ A is added where it has one, and the sum is stored as Q8_0 (8-bit blocks of 32, which
re-represent Q5_0/Q4_K/Q6_K values to within ~1/16 of their own step). The token embedding is looked
up, not multiplied, so it stays as it is. All metadata is copied unchanged. The file is built once and
cached by the base file's identity and the adapter's checksum (~30 s and ~625 MB for the 0.5B).

Not bit-for-bit the runtime adapter: the product B @ A is added to the weights rather than applied to
Q8-quantised activations, and a read near a tie can go the other way (the README demo's second answer
does, for memagent-notes-0.5b; docs/engines.md). So it is an opt-in speed option, not the default.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from .models import ModelError, _sha256, cache_root

KEEP = {"token_embd.weight"}  # looked up per token, never multiplied: no speed to gain
TARGET = "Q8_0"


def _read_adapter(path: Path) -> tuple[dict[str, np.ndarray], float]:
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = {f.name: f for f in r.fields.values()}
    if "adapter.lora.alpha" not in fields or fields.get("adapter.type") is None:
        raise ModelError(f"{path} is not a GGUF LoRA adapter (no adapter.type / adapter.lora.alpha)")
    alpha = float(fields["adapter.lora.alpha"].contents())
    return {t.name: np.array(t.data, dtype=np.float32) for t in r.tensors}, alpha


def merge_lora_gguf(base: str | Path, adapter: str | Path, out: str | Path, scale: float = 1.0) -> Path:
    """Write `out`: `base` with `adapter` (a GGUF LoRA, as gguf_export writes) folded in at `scale`.

    The LoRA delta of a matrix W (numpy shape out x in) is scale * alpha / rank * B @ A, A being
    `<name>.lora_a` (rank x in) and B `<name>.lora_b` (out x rank): what llama.cpp adds at run time.
    """
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import dequantize, quantize

    base, adapter, out = Path(base), Path(adapter), Path(out)
    lora, alpha = _read_adapter(adapter)
    r = gguf.GGUFReader(str(base))
    names = {t.name for t in r.tensors}
    targets = {k[: -len(".lora_a")] for k in lora if k.endswith(".lora_a")}
    missing = sorted(targets - names)
    if missing or {k[: -len(".lora_b")] for k in lora if k.endswith(".lora_b")} != targets:
        raise ModelError(f"adapter {adapter.name} does not fit {base.name}: "
                         f"{'no base matrix for ' + ', '.join(missing[:3]) if missing else 'unpaired lora_a/lora_b'}")
    target = Q[TARGET]
    tensors = []
    for t in r.tensors:
        data, kind = t.data, t.tensor_type
        quantized = kind not in (Q.F32, Q.F16, Q.BF16) and len(t.shape) == 2 and t.name not in KEEP
        if t.name in targets or quantized:
            w = dequantize(data, kind).astype(np.float32)
            if t.name in targets:
                a, b = lora[t.name + ".lora_a"], lora[t.name + ".lora_b"]
                if b.shape[0] != w.shape[0] or a.shape[1] != w.shape[1] or a.shape[0] != b.shape[1]:
                    raise ModelError(f"adapter {adapter.name}: {t.name} is {w.shape}, its LoRA "
                                     f"{b.shape} @ {a.shape}")
                w += (scale * alpha / a.shape[0]) * (b @ a)
            if w.shape[-1] % 32:  # Q8_0 blocks are 32 wide; keep such a matrix in f32 (none in our models)
                data, kind = w, Q.F32
            else:
                data, kind = quantize(w, target), target
        tensors.append((t.name, data, kind))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    metadata = [(f.name, f.contents(), f.types[0], f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None)
                for f in r.fields.values()
                if f.name != "general.architecture" and not f.name.startswith("GGUF.")]  # the writer adds these
    try:
        write_gguf(tmp, r.fields["general.architecture"].contents(), metadata, tensors)
    except BaseException:  # a full disk or Ctrl-C leaves no partial file behind
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, out)  # a reader never sees a half-written file
    return out


def write_gguf(path: str | Path, arch: str, metadata: list[tuple], tensors: list[tuple]) -> Path:
    """A GGUF file of `metadata` [(key, value, GGUFValueType, array item type or None)] and `tensors`
    [(name, numpy data as stored: raw bytes for a quantized type, GGMLQuantizationType)]."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value, kind, sub_type in metadata:
        writer.add_key_value(key, value, kind, sub_type=sub_type)
    for name, data, kind in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
    return Path(path)


def cached_merged_gguf(base: str | Path, adapter: str | Path, scale: float = 1.0) -> Path:
    """The merged GGUF of `base` + `adapter`, built once and cached by both files' checksums."""
    from .models import _Lock

    base = Path(base).resolve()
    st = base.stat()  # the base is large and checked when assembled; its identity is enough here
    h = hashlib.sha256(f"{base}:{st.st_size}:{st.st_mtime_ns}:{_sha256(Path(adapter))}:{scale!r}:{TARGET}".encode())
    out = cache_root() / "merged" / h.hexdigest()[:20] / "model.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with _Lock(out.parent / ".lock"):  # two processes starting at once build it once
        if not out.is_file():
            merge_lora_gguf(base, adapter, out, scale)
    return out


__all__ = ["merge_lora_gguf", "cached_merged_gguf", "write_gguf"]
