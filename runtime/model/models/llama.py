"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) as one decoder.

Qwen2 differs by a bias on q/k/v, Qwen3 by RMSNorm on each head of q and k before RoPE;
ModelConfig says which. q/k/v and gate/up each run as one matmul (their checkpoint tensors
load into one layer). The layers hold this rank's share under tensor parallelism.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from arbor.runtime.model.causal_lm import CausalLM
from arbor.runtime.model.forward_batch import ForwardBatch
from arbor.runtime.model.layers import (
    GatedMLP,
    ParallelLMHead,
    QKVParallelLinear,
    RMSNorm,
    RotaryEmbedding,
    RowParallelLinear,
    ShardId,
    TiedLMHead,
    VocabParallelEmbedding,
)
from arbor.runtime.model.model_config import ModelConfig
from arbor.runtime.model.parallel import SINGLE, TensorParallel


class Attention(nn.Module):
    """Self-attention: fused qkv projection, optional q/k norm, RoPE, paged attention."""

    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        self.layer = layer
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.qkv_bias, tp
        )
        self.nq, self.nkv, self.hd = self.qkv_proj.num_heads, self.qkv_proj.num_kv_heads, cfg.head_dim
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, tp)
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
        return self.o_proj(batch.attn_backend.forward(q, k, v, self.layer, batch))


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks; the residual add is fused into the next norm."""

    def __init__(self, cfg: ModelConfig, layer: int, rotary: RotaryEmbedding, tp: TensorParallel) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer, rotary, tp)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, tp, cfg.hidden_act)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None, batch: ForwardBatch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            residual, x = x, self.input_layernorm(x)
        else:
            x, residual = self.input_layernorm(x, residual)
        x = self.self_attn(x, batch)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(CausalLM):
    """Embedding, decoder layers, final norm and LM head."""

    packed_modules_mapping: ClassVar[dict[str, tuple[str, ShardId]]] = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__(cfg, tp)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, rotary, tp) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = (
            TiedLMHead(self.embed_tokens)
            if cfg.tie_word_embeddings
            else ParallelLMHead(cfg.vocab_size, cfg.hidden_size, tp)
        )

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.embed_tokens(batch.input_ids)
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, batch)
        x, _ = self.norm(x, residual)
        return x
