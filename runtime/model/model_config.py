"""ModelConfig: the parts of a checkpoint's config.json that our models need, validated."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbor.runtime.model.errors import CheckpointError
from arbor.runtime.model.quant.config import QuantConfig
from arbor.runtime.model.quant.config import parse as parse_quant_config
from arbor.runtime.model.registry import ARCHITECTURES

__all__ = ["CheckpointError", "ModelConfig"]

ACTIVATIONS = ("silu", "gelu_pytorch_tanh")  # the hidden_act values layers/mlp.py runs
_QK_NORM_ARCHS = {"Qwen3ForCausalLM"}
_QKV_BIAS_ARCHS = {"Qwen2ForCausalLM"}


@dataclass(frozen=True)
class ModelConfig:
    """Shapes and options of a decoder (registry.py: which architectures Arbor serves)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...]
    quant: QuantConfig | None = None  # the checkpoint's quantization_config, parsed
    hidden_act: str = "silu"  # the MLP's activation

    def kv_bytes_per_token(self, element_size: int) -> int:
        """Bytes of K and V cache one token takes across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        """Read and validate `path/config.json` (and generation_config.json for EOS ids)."""
        raw = _read_json(Path(path) / "config.json", required=True)
        arch = (raw.get("architectures") or [None])[0]
        if arch not in ARCHITECTURES:
            raise CheckpointError(
                f"{path}: unsupported architecture {arch!r}; Arbor serves {', '.join(sorted(ARCHITECTURES))}"
            )
        act = raw.get("hidden_act", "silu")
        if act not in ACTIVATIONS:
            raise CheckpointError(f"{path}: hidden_act {act!r} is not supported ({', '.join(ACTIVATIONS)})")
        try:
            heads = int(raw["num_attention_heads"])
            hidden = int(raw["hidden_size"])
            theta, scaling = _rope(raw)
            context = int(raw.get("max_position_embeddings", 2048))
            window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
            if window:
                # Full attention equals sliding-window attention while the context fits
                # in the window, so cap the context instead of masking by window.
                context = min(context, int(window))
            return cls(
                architecture=arch,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=int(raw["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=scaling,
                max_position_embeddings=context,
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
                qkv_bias=bool(raw.get("attention_bias", arch in _QKV_BIAS_ARCHS)),
                qk_norm=arch in _QK_NORM_ARCHS,
                eos_token_ids=_eos_ids(raw, Path(path)),
                quant=parse_quant_config(raw, str(path)),
                hidden_act=act,
            )
        except CheckpointError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}/config.json: missing or malformed field {e}") from None


def _read_json(path: Path, required: bool) -> dict[str, Any]:
    if not path.parent.is_dir():
        raise CheckpointError(f"checkpoint directory {path.parent} does not exist")
    if not path.exists():
        if required:
            raise CheckpointError(f"{path.parent} is not a Hugging Face checkpoint: no config.json")
        return {}
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    return data


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(theta, scaling) from either the legacy (rope_theta + rope_scaling) or the
    transformers-5 (rope_parameters) form; scaling None means plain RoPE."""
    params = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind not in ("linear", "llama3"):
        raise CheckpointError(f"rope scaling type {kind!r} is not supported (default, linear, llama3)")
    params["rope_type"] = kind
    return theta, params


def _eos_ids(raw: dict[str, Any], path: Path) -> tuple[int, ...]:
    gen = _read_json(path / "generation_config.json", required=False)
    ids = gen.get("eos_token_id", raw.get("eos_token_id"))
    if ids is None:
        return ()
    return tuple(ids) if isinstance(ids, list) else (int(ids),)
