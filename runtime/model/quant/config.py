"""A checkpoint's `quantization_config`, parsed and checked against what Arbor runs.

Supported (compressed-tensors, as llmcompressor writes it):
- `pack-quantized`: int4 or int8 weights packed into int32, per channel or per group,
  symmetric or with zero points; activations stay in the model's dtype (W4A16, W8A16).
- `int-quantized`: int8 weights per channel, with int8 activations quantized per token at
  run time (W8A8, SmoothQuant's output).
- `float-quantized`: float8_e4m3 weights per channel or per tensor, with float8
  activations quantized per token at run time, or none (FP8 dynamic, FP8 weight-only).
And AutoAWQ's GEMM layout (`quant_method: awq`, `version: gemm`): int4 weights in groups, with
zero points; and GPTQ's layout (`quant_method: gptq`, as AutoGPTQ, GPTQModel and optimum write
it): int4 or int8 weights per group or channel, symmetric or not, with or without act-order
(`desc_act`). Anything else is refused by name, before any weight is read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from arbor.runtime.model.errors import CheckpointError

FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
AWQ_GEMM = "awq-gemm"  # AutoAWQ's layout, as a format of its own
GPTQ_V1, GPTQ_V2 = "gptq", "gptq_v2"  # GPTQ's layout; v1 stores each zero point minus one


@dataclass(frozen=True)
class WeightScheme:
    """How one group of linear layers is quantized."""

    format: str  # one of FORMATS
    bits: int
    kind: str  # "int" or "float"
    symmetric: bool
    group_size: int | None  # None: one scale per output channel (or per tensor)
    activations: str | None  # None (weight-only), "int8" or "fp8": quantized per token at run time

    @property
    def name(self) -> str:
        """A short name for logs and benchmarks: W4A16, W8A8-INT8, FP8..."""
        act = {"int8": "A8-INT8", "fp8": "A8-FP8", None: "A16"}[self.activations]
        return f"W{self.bits}{act}" if self.kind == "int" else f"FP8-W{act}"


@dataclass(frozen=True)
class QuantConfig:
    """Which linear layers are quantized, and how (first matching group wins)."""

    groups: tuple[tuple[tuple[str, ...], WeightScheme], ...]
    ignore: tuple[str, ...]

    def scheme_for(self, module: str) -> WeightScheme | None:
        """The scheme of the Hugging Face-named linear `module` ("model.layers.0.mlp.up_proj"),
        or None where it is left unquantized."""
        if any(_matches(pattern, module) for pattern in self.ignore):
            return None
        for targets, scheme in self.groups:
            if any(_matches(t, module) for t in targets):
                return scheme
        return None


def _matches(target: str, module: str) -> bool:
    if target == "Linear":  # every linear layer (the class name compressed-tensors targets)
        return True
    if target.startswith("re:"):
        return re.match(target[3:], module) is not None
    return module == target or module.endswith("." + target)


def parse(raw: dict[str, Any], where: str) -> QuantConfig | None:
    """The QuantConfig of a config.json (None when it has no quantization_config)."""
    qc = raw.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == "awq":
        return _awq(qc, where)
    if method == "gptq":
        return _gptq(qc, where)
    if method != "compressed-tensors":
        raise CheckpointError(
            f"{where}: quantization method {method!r} is not supported (Arbor loads "
            "compressed-tensors checkpoints, as llmcompressor writes them, AutoAWQ's GEMM layout "
            "and GPTQ's)"
        )
    for key in ("sparsity_config", "transform_config"):
        if qc.get(key):
            raise CheckpointError(f"{where}: compressed-tensors {key} is not supported (dense weights only)")
    if qc.get("kv_cache_scheme"):
        raise CheckpointError(
            f"{where}: a kv_cache_scheme in the checkpoint is not supported; "
            "use --kv-cache-dtype fp8_e4m3 for a float8 KV cache"
        )
    groups = []
    for name, group in (qc.get("config_groups") or {}).items():
        fmt = group.get("format") or qc.get("format")
        scheme = _scheme(
            f"{where}: config group {name!r}",
            fmt,
            group.get("weights"),
            group.get("input_activations"),
            group.get("output_activations"),
        )
        groups.append((tuple(group.get("targets") or ()), scheme))
    if not groups:
        raise CheckpointError(f"{where}: quantization_config has no config_groups")
    return QuantConfig(tuple(groups), tuple(qc.get("ignore") or ()))


def _awq(qc: dict[str, Any], where: str) -> QuantConfig:
    version, bits = str(qc.get("version", "gemm")).lower(), int(qc.get("bits", qc.get("w_bit", 0)))
    if version != "gemm" or bits != 4:
        raise CheckpointError(
            f"{where}: AWQ version {version!r} with {bits}-bit weights is not supported "
            "(AutoAWQ's GEMM layout, 4-bit, is)"
        )
    scheme = WeightScheme(AWQ_GEMM, 4, "int", not qc.get("zero_point", True), int(qc["group_size"]), None)
    return QuantConfig(((("Linear",), scheme),), ("lm_head", *(qc.get("modules_to_not_convert") or ())))


def _gptq(qc: dict[str, Any], where: str) -> QuantConfig:
    bits, group = int(qc.get("bits", 0)), int(qc.get("group_size", -1))
    fmt = str(qc.get("checkpoint_format", GPTQ_V1)).lower()
    if fmt not in (GPTQ_V1, GPTQ_V2):
        raise CheckpointError(f"{where}: GPTQ checkpoint_format {fmt!r} is not supported ({GPTQ_V1} and {GPTQ_V2} are)")
    if bits not in (4, 8):
        raise CheckpointError(f"{where}: {bits}-bit GPTQ weights are not supported (4 and 8 are)")
    for key in ("dynamic", "lm_head"):
        if qc.get(key):
            raise CheckpointError(f"{where}: GPTQ `{key}` (per-module overrides, a quantized LM head) is not supported")
    scheme = WeightScheme(fmt, bits, "int", bool(qc.get("sym", True)), None if group == -1 else group, None)
    return QuantConfig(((("Linear",), scheme),), ("lm_head", *(qc.get("modules_to_not_convert") or ())))


def _scheme(where: str, fmt: str | None, w: dict | None, act: dict | None, out: dict | None) -> WeightScheme:
    def refuse(what: str) -> CheckpointError:
        return CheckpointError(f"{where}: {what} is not supported")

    if fmt not in FORMATS:
        raise refuse(f"format {fmt!r} (supported: {', '.join(FORMATS)})")
    if not w:
        raise refuse("a group without weight quantization")
    if out:
        raise refuse("output activation quantization")
    bits, kind, strategy = int(w.get("num_bits", 0)), w.get("type"), w.get("strategy")
    if w.get("dynamic") or w.get("block_structure") or w.get("actorder") == "group":
        raise refuse(f"weight options dynamic/block/actorder=group ({w})")
    if kind == "int" and bits not in (4, 8):
        raise refuse(f"{bits}-bit integer weights (4 and 8 are)")
    if kind == "float" and (bits != 8 or not w.get("symmetric", True)):
        raise refuse(f"{bits}-bit or asymmetric float weights (float8_e4m3, symmetric, is)")
    if kind not in ("int", "float"):
        raise refuse(f"weight type {kind!r}")
    if strategy not in ("channel", "group", "tensor"):
        raise refuse(f"weight strategy {strategy!r} (channel, group and tensor are)")
    if strategy == "tensor" and kind == "int":
        raise refuse("per-tensor integer weights")
    group = int(w["group_size"]) if strategy == "group" else None
    if kind == "float" and group is not None:
        raise refuse("grouped float8 weights")
    activations = None
    if act:
        a_kind, a_bits = act.get("type"), int(act.get("num_bits", 0))
        if not (act.get("dynamic") and act.get("strategy") == "token" and act.get("symmetric", True) and a_bits == 8):
            raise refuse(f"input activations {act} (8-bit, dynamic, per token, symmetric are)")
        if a_kind != kind:
            raise refuse(f"{a_kind} activations with {kind} weights")
        activations = "int8" if a_kind == "int" else "fp8"
    if kind == "int" and activations and (bits != 8 or group is not None or not w.get("symmetric", True)):
        raise refuse("int8 activations with weights other than int8 per channel, symmetric")
    return WeightScheme(fmt, bits, kind, bool(w.get("symmetric", True)), group, activations)
