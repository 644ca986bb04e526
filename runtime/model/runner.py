"""ModelRunner: owns the model, the KV memory and the attention backend; runs one step."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from arbor.runtime.config import CacheArgs, ModelArgs
from arbor.runtime.kv.pool import KVPool, PageAllocator, ReqToTokenPool
from arbor.runtime.model.attention import create_backend, resolve_backend
from arbor.runtime.model.forward_batch import ForwardBatch, ForwardMode
from arbor.runtime.model.kernel_select import use_cpu_kernels, use_triton_kernels
from arbor.runtime.model.loader import load_model
from arbor.runtime.model.packed_linear import can_pack, pack_linears
from arbor.runtime.model.parallel import SINGLE, TensorParallel
from arbor.runtime.spec.frequent_token_head import use_frequent_token_head

logger = logging.getLogger(__name__)


@dataclass
class LogitsOutput:
    """next_token_logits [B, V]; all_logits [T, V] when the batch asked for them. Both in the
    model's dtype: an argmax needs no float32 copy of 50k columns a row; sampling widens."""

    next_token_logits: torch.Tensor
    all_logits: torch.Tensor | None = None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA and on CPUs with fast bf16 matmuls, else float32."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if _cpu_has_fast_bf16() else torch.float32


def _cpu_has_fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class ModelRunner:
    """Loads the checkpoint, sizes and allocates the KV cache, and runs forward passes."""

    def __init__(
        self,
        model: ModelArgs,
        cache: CacheArgs,
        max_running_requests: int,
        model_path: str,
        hot_tokens: torch.Tensor | None = None,
        tp: TensorParallel = SINGLE,
        num_slots: int | None = None,
    ) -> None:
        """`model_path`: the checkpoint (`model.path` resolved); `max_running_requests` rows in
        the request-to-slot table. `hot_tokens`: compute logits for these token ids only (a
        draft's FrequentTokenHead; `columns` then names each logits column's token). Under
        tensor parallelism, `tp` is this rank and `num_slots` the KV capacity rank 0 chose."""
        self.device = resolve_device(model.device)
        self.dtype = resolve_dtype(model.dtype, self.device)
        self.tp = tp
        self.leader: Callable[[ForwardBatch], None] | None = None  # rank 0: sends each batch to the other ranks
        self.model, self.config = load_model(model_path, self.dtype, self.device, tp, model.load_format)
        self.columns: torch.Tensor | None = None  # None: logits cover the whole vocabulary
        if hot_tokens is not None:
            self.columns = use_frequent_token_head(self.model, hot_tokens)
        cfg = self.config
        self.context_len = min(model.context_length or cfg.max_position_embeddings, cfg.max_position_embeddings)
        ps = cache.page_size
        table_width = -(-self.context_len // ps) * ps
        self.kv_dtype = torch.float8_e4m3fn if cache.dtype in ("fp8", "fp8_e4m3") else self.dtype
        num_slots = num_slots or self._kv_slots(cache, max_running_requests)
        kv_heads = tp.kv_heads(cfg.num_kv_heads)
        self.kv_pool = KVPool(num_slots, cfg.num_layers, kv_heads, cfg.head_dim, self.kv_dtype, self.device)
        self.allocator = PageAllocator(num_slots, ps)
        self.req_to_token = ReqToTokenPool(max_running_requests, table_width, self.device, ps)
        self.attn_backend = create_backend(model.attention_backend, self.kv_pool, self.req_to_token, cfg.head_dim**-0.5)
        if resolve_backend(model.attention_backend, self.device.type) == "triton":
            use_triton_kernels(self.model)
        elif self.device.type == "cpu":
            use_cpu_kernels(self.model)
        if can_pack(self.dtype, self.device):
            pack_linears(self.model)
        logger.info(
            "loaded %s (%s, %s) on %s: KV cache %d tokens (%s, %.1f MiB), context %d",
            model_path,
            cfg.architecture,
            str(self.dtype).removeprefix("torch."),
            self.device,
            self.allocator.total_slots,
            str(self.kv_dtype).removeprefix("torch."),
            self.kv_pool.nbytes() / 2**20,
            self.context_len,
        )

    def _kv_slots(self, cache: CacheArgs, max_running_requests: int) -> int:
        """KV capacity in slots, rounded to whole pages, plus the reserved page 0."""
        ps = cache.page_size
        if cache.max_total_tokens is not None:
            tokens = cache.max_total_tokens
        else:
            per_token = self.config.kv_bytes_per_token(torch.finfo(self.kv_dtype).bits // 8)
            budget = int(_free_memory_bytes(self.device) * cache.memory_fraction)
            tokens = min(max_running_requests * self.context_len, budget // per_token)
        return (-(-tokens // ps) + 1) * ps

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch) -> LogitsOutput:
        """Run one step; logits of each request's last new token (and of all, if asked)."""
        if self.leader is not None:
            self.leader(batch)
        batch.attn_backend = self.attn_backend
        self.attn_backend.init_forward_metadata(batch)
        hidden = self.model(batch)
        if batch.mode is ForwardMode.DECODE and not batch.return_all_logits:  # one row per request
            return LogitsOutput(self.model.logits(hidden))
        last = (batch.qo_indptr[1:] - 1).to(torch.int64)
        if batch.return_all_logits:
            all_logits = self.model.logits(hidden)
            return LogitsOutput(all_logits[last], all_logits)
        return LogitsOutput(self.model.logits(hidden[last]))


def _free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
