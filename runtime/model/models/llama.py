"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) as one decoder.

Qwen2 differs by a bias on q/k/v, Qwen3 by RMSNorm on each head of q and k before RoPE;
ModelConfig says which. q/k/v and gate/up are fused into single matmuls at load time. Under
tensor parallelism (`parallel.py`) each rank builds its share: its heads, its slice of the MLP
and of the vocabulary, loaded shard by shard.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from arbor.runtime.model.forward_batch import ForwardBatch
from arbor.runtime.model.layers import GatedMLP, RMSNorm, RotaryEmbedding
from arbor.runtime.model.model_config import CheckpointError, ModelConfig
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.model.quant.linear import QuantLinear


class Attention(nn.Module):
    """Self-attention: fused qkv projection, optional q/k norm, RoPE, paged attention."""

    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        self.layer, self.tp = layer, tp
        self.nq, self.nkv, self.hd = cfg.num_heads // tp.size, tp.kv_heads(cfg.num_kv_heads), cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.nq + 2 * self.nkv) * self.hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.nq * self.hd, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.rotary = rotary

    def forward(self, x: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.nq * self.hd, self.nkv * self.hd, self.nkv * self.hd], -1)
        q = q.view(-1, self.nq, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(batch.positions, q, k)
        assert batch.attn_backend is not None, "ModelRunner sets the attention backend"
        return self.tp.all_reduce(self.o_proj(batch.attn_backend.forward(q, k, v, self.layer, batch)))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks; the residual add is fused into the next norm."""

    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        self.tp = tp
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, rotary, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size // tp.size)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.tp.all_reduce(self.mlp(x)), residual


class VocabParallelEmbedding(nn.Embedding):
    """This rank's rows of the embedding; ids outside its range look up zeros, and the
    all-reduce fills them in from the rank that owns them."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel) -> None:
        super().__init__(tp.vocab_rows(cfg.vocab_size), cfg.hidden_size)
        self.tp, self.lo = tp, tp.vocab_range(cfg.vocab_size)[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.lo
        outside = (local < 0) | (local >= self.num_embeddings)
        x = super().forward(local.masked_fill(outside, 0))
        return self.tp.all_reduce(x.masked_fill_(outside[:, None], 0))


class LlamaForCausalLM(nn.Module):
    """Embedding, decoder layers, final norm and LM head."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        tp.check(cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
        self.config, self.tp = cfg, tp
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        split = tp.size > 1
        self.embed_tokens = VocabParallelEmbedding(cfg, tp) if split else nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        head_rows = tp.vocab_rows(cfg.vocab_size)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, head_rows, bias=False)
        self.packed_head: nn.Module | None = None  # a tied head packed for CPU matmuls (packed.py)

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        """Final hidden states [T, hidden] of every new token."""
        x = self.embed_tokens(batch.input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, batch)
        x, _ = self.norm(x, residual)
        return x

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [N, vocab] in the model's dtype for hidden states [N, hidden]."""
        if self.lm_head is not None:
            local = self.lm_head(hidden)
        elif self.packed_head is not None:
            local = self.packed_head(hidden)
        else:
            local = hidden @ self.embed_tokens.weight.T
        return self.tp.gather_vocab(local, self.config.vocab_size)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face-named tensors in, fusing q/k/v and gate/up; every parameter
        must be filled exactly once, or CheckpointError names what is missing or unknown."""
        params = dict(self.named_parameters())
        quantized = {n: m for n, m in self.named_modules() if isinstance(m, QuantLinear)}
        filled: dict[str, int] = {}
        for hf_name, tensor in weights:
            if "rotary_emb.inv_freq" in hf_name:
                continue
            if hf_name == "lm_head.weight" and self.lm_head is None:
                continue  # tied checkpoints may still ship a copy of the embedding
            name, lo, hi = self._target(hf_name)
            module, _, key = name.rpartition(".")
            if module in quantized and key != "bias":
                quantized[module].stage(lo or 0, key, tensor)
                continue
            if module in quantized and quantized[module].bias is None and not tensor.any():
                continue  # GPTQ writers give every quantized layer a bias, zero where the model has none
            if name not in params:
                raise CheckpointError(f"checkpoint tensor {hf_name!r} has no place in {type(self).__name__}")
            dest = params[name].data
            part = dest if lo is None else dest[lo:hi]
            if name in ("embed_tokens.weight", "lm_head.weight") and tensor.shape[0] < part.shape[0]:
                part[tensor.shape[0]:].zero_()  # the last rank's vocabulary slice, padded
                part = part[:tensor.shape[0]]
                filled[name] = dest.shape[0] - tensor.shape[0]
            if part.shape != tensor.shape:
                raise CheckpointError(f"{hf_name}: shape {tuple(tensor.shape)}, expected {tuple(part.shape)}")
            part.copy_(tensor)
            filled[name] = filled.get(name, 0) + part.shape[0]
        missing = [n for n, p in params.items() if filled.get(n, 0) != p.shape[0]]
        if missing:
            raise CheckpointError(f"checkpoint lacks weights for {', '.join(missing[:5])}")
        for name, layer in quantized.items():
            layer.build(name)

    def shard(self, hf_name: str) -> tuple[int, int, int] | None:
        """The slice (dim, lo, hi) of checkpoint tensor `hf_name` that this rank holds, or None
        for all of it (every tensor without tensor parallelism; norms always)."""
        tp, cfg = self.tp, self.config
        if tp.size == 1:
            return None
        hd, r = cfg.head_dim, tp.rank
        nq, nkv = cfg.num_heads // tp.size, tp.kv_heads(cfg.num_kv_heads)
        inter = cfg.intermediate_size // tp.size
        kv0 = tp.kv_head_start(cfg.num_kv_heads)
        rows = {"q_proj": (r * nq * hd, (r + 1) * nq * hd), "k_proj": (kv0 * hd, (kv0 + nkv) * hd),
                "v_proj": (kv0 * hd, (kv0 + nkv) * hd), "gate_proj": (r * inter, (r + 1) * inter),
                "up_proj": (r * inter, (r + 1) * inter)}
        cols = {"o_proj": rows["q_proj"], "down_proj": rows["gate_proj"]}
        if hf_name in ("model.embed_tokens.weight", "lm_head.weight"):
            return (0, *tp.vocab_range(cfg.vocab_size))
        kind = hf_name.split(".")[-2]  # "model.layers.0.self_attn.q_proj.weight" -> "q_proj"
        if kind in rows:
            return (0, *rows[kind])
        if kind in cols and hf_name.endswith(".weight"):
            return (1, *cols[kind])
        return None

    def linear_parts(self, name: str) -> list[tuple[str, int, int]]:
        """The checkpoint layers fused into our linear `name`: (HF name, first row, rows)."""
        cfg, tp = self.config, self.tp
        if name == "lm_head":
            return [("lm_head", 0, cfg.vocab_size)]
        q, kv = cfg.num_heads // tp.size * cfg.head_dim, tp.kv_heads(cfg.num_kv_heads) * cfg.head_dim
        inter = cfg.intermediate_size // tp.size
        fused = {"qkv_proj": [("q_proj", q), ("k_proj", kv), ("v_proj", kv)],
                 "gate_up_proj": [("gate_proj", inter), ("up_proj", inter)]}
        prefix, _, leaf = name.rpartition(".")
        parts, lo = [], 0
        for part, rows in fused.get(leaf, [(leaf, self.get_submodule(name).out_features)]):
            parts.append((f"model.{prefix}.{part}", lo, rows))
            lo += rows
        return parts

    def _target(self, hf_name: str) -> tuple[str, int | None, int | None]:
        """Our parameter name for an HF tensor, and the row range it fills in a fused one."""
        name = hf_name.removeprefix("model.")
        cfg, tp = self.config, self.tp
        q, kv = cfg.num_heads // tp.size * cfg.head_dim, tp.kv_heads(cfg.num_kv_heads) * cfg.head_dim
        inter = cfg.intermediate_size // tp.size
        fused = {
            "q_proj": ("qkv_proj", 0, q),
            "k_proj": ("qkv_proj", q, q + kv),
            "v_proj": ("qkv_proj", q + kv, q + 2 * kv),
            "gate_proj": ("gate_up_proj", 0, inter),
            "up_proj": ("gate_up_proj", inter, 2 * inter),
        }
        for part, (target, lo, hi) in fused.items():
            if f".{part}." in name:
                return name.replace(part, target), lo, hi
        return name, None, None
