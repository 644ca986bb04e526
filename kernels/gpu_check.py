"""Check and time every Triton kernel on a CUDA GPU: `python -m arbor.kernels.gpu_check [--out DIR]`.

Each kernel runs on fresh random inputs at serving sizes (Llama-3-8B shapes: 32 query heads,
8 KV heads, head_dim 128, bf16), is compared with its torch reference, and is timed with
`triton.testing.do_bench` (median). Achieved GB/s (memory-bound ops) or TFLOP/s (extend
attention) are printed beside the device's measured copy bandwidth and bf16 matmul rate.
The table comes last; with --out it is also written as gpu_check.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from triton.testing import do_bench

from arbor.kernels.activation import silu_and_mul_triton
from arbor.kernels.bitmask import apply_token_bitmask_triton
from arbor.kernels.decode_attention import decode_attention_triton
from arbor.kernels.extend_attention import extend_attention_triton
from arbor.kernels.kv_store import store_kv_triton
from arbor.kernels.norm import rmsnorm_triton
from arbor.kernels.reference import (
    apply_token_bitmask_ref,
    decode_attention_ref,
    extend_attention_ref,
    rmsnorm_ref,
    rotary_ref,
    silu_and_mul_ref,
    store_kv_ref,
    woq_dequantize_ref,
)
from arbor.kernels.rotary import rotary_triton
from arbor.kernels.woq_matmul import woq_matmul_triton

DT = torch.bfloat16
HQ, HKV, D = 32, 8, 128


def _ms(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def _paged(batch: int, length: int, page: int = 16) -> tuple[torch.Tensor, torch.Tensor, int]:
    pages = batch * (-(-length // page))
    order = torch.randperm(pages, device="cuda") + 1
    slots = (order[:, None] * page + torch.arange(page, device="cuda")).reshape(batch, -1)[:, :length]
    indptr = torch.arange(batch + 1, device="cuda", dtype=torch.int32) * length
    return indptr, slots.reshape(-1).to(torch.int32), (pages + 1) * page


def peaks() -> dict[str, float]:
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / _ms(lambda: dst.copy_(src)) / 1e6
    a = torch.randn(8192, 8192, dtype=DT, device="cuda")
    mm = 2 * 8192**3 / _ms(lambda: a @ a) / 1e9
    return {"copy_GB_s": copy, "matmul_TFLOP_s": mm}


def checks() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, shape: str, err: float, tol: float, ms: float, amount: float, unit: str) -> None:
        rows.append(
            {
                "kernel": name,
                "shape": shape,
                "rel_err": err,
                "ok": err <= tol,
                "ms": ms,
                "rate": amount / ms / (1e6 if unit == "GB/s" else 1e9),
                "unit": unit,
            }
        )

    # Decode attention: batch 64, 4k context (the bandwidth target).
    b, n = 64, 4096
    indptr, idx, size = _paged(b, n)
    kp, vp = (torch.randn(size, HKV, D, dtype=DT, device="cuda") for _ in range(2))
    q = torch.randn(b, HQ, D, dtype=DT, device="cuda")
    args = (q, kp, vp, indptr, idx, D**-0.5)
    err = _err(decode_attention_triton(*args), decode_attention_ref(*args))
    add(
        "decode_attention",
        f"B={b} ctx={n} {HQ}/{HKV}x{D}",
        err,
        2e-2,
        _ms(lambda: decode_attention_triton(*args)),
        2 * b * n * HKV * D * 2 + idx.numel() * 4,
        "GB/s",
    )
    # Extend attention: 8 requests, 1,024 cached + 512 new tokens each.
    b, pre, ext = 8, 1024, 512
    indptr, idx, size = _paged(b, pre)
    kp, vp = (torch.randn(size, HKV, D, dtype=DT, device="cuda") for _ in range(2))
    q = torch.randn(b * ext, HQ, D, dtype=DT, device="cuda")
    k, v = (torch.randn(b * ext, HKV, D, dtype=DT, device="cuda") for _ in range(2))
    qo = torch.arange(b + 1, device="cuda", dtype=torch.int32) * ext
    ext_args = (q, k, v, kp, vp, qo, indptr, idx, D**-0.5, ext)
    err = _err(extend_attention_triton(*ext_args), extend_attention_ref(*ext_args))
    flops = 4 * b * HQ * D * (ext * pre + ext * (ext + 1) / 2)
    add(
        "extend_attention",
        f"B={b} prefix={pre} new={ext}",
        err,
        2e-2,
        _ms(lambda: extend_attention_triton(*ext_args)),
        flops,
        "TFLOP/s",
    )
    t, h, inter = 4096, 4096, 14336
    x, r = (torch.randn(t, h, dtype=DT, device="cuda") for _ in range(2))
    w = torch.randn(h, dtype=DT, device="cuda")
    err = _err(rmsnorm_triton(x, w, 1e-5, r)[0], rmsnorm_ref(x, w, 1e-5, r)[0])
    add("add_rmsnorm", f"T={t} H={h}", err, 2e-2, _ms(lambda: rmsnorm_triton(x, w, 1e-5, r)), 4 * t * h * 2, "GB/s")
    gu = torch.randn(t, 2 * inter, dtype=DT, device="cuda")
    err = _err(silu_and_mul_triton(gu), silu_and_mul_ref(gu))
    add("silu_and_mul", f"T={t} I={inter}", err, 2e-2, _ms(lambda: silu_and_mul_triton(gu)), 3 * t * inter * 2, "GB/s")
    pos = torch.randint(0, 8192, (t,), device="cuda")
    freqs = torch.outer(torch.arange(8192, device="cuda").float(), 1e-4 ** (torch.arange(0, D, 2, device="cuda") / D))
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
    qr, kr = torch.randn(t, HQ, D, dtype=DT, device="cuda"), torch.randn(t, HKV, D, dtype=DT, device="cuda")
    want = rotary_ref(pos, qr.clone(), kr.clone(), cos, sin)
    got = rotary_triton(pos, qr.clone(), kr.clone(), cos, sin)
    err = max(_err(got[0], want[0]), _err(got[1], want[1]))
    add(
        "rotary",
        f"T={t} {HQ}/{HKV}x{D}",
        err,
        2e-2,
        _ms(lambda: rotary_triton(pos, qr, kr, cos, sin)),
        2 * t * (HQ + HKV) * D * 2,
        "GB/s",
    )
    rows_, vocab = 64, 128256
    logits = torch.randn(rows_, vocab, device="cuda")
    mask = torch.randint(-(2**31), 2**31 - 1, (rows_, -(-vocab // 32)), device="cuda", dtype=torch.int64).to(
        torch.int32
    )
    a, c = logits.clone(), logits.clone()
    apply_token_bitmask_ref(a, mask)
    apply_token_bitmask_triton(c, mask)
    add(
        "token_bitmask",
        f"B={rows_} V={vocab}",
        0.0 if torch.equal(a, c) else 1.0,
        0.0,
        _ms(lambda: apply_token_bitmask_triton(logits, mask)),
        2 * rows_ * vocab * 4 + mask.numel() * 4,
        "GB/s",
    )
    indptr, idx, size = _paged(1, t)
    pools = [torch.zeros(size, HKV, D, dtype=DT, device="cuda") for _ in range(4)]
    k, v = (torch.randn(t, HKV, D, dtype=DT, device="cuda") for _ in range(2))
    store_kv_ref(pools[0], pools[1], idx, k, v)
    store_kv_triton(pools[2], pools[3], idx, k, v)
    same = torch.equal(pools[0], pools[2]) and torch.equal(pools[1], pools[3])
    add(
        "kv_store",
        f"T={t} {HKV}x{D}",
        0.0 if same else 1.0,
        0.0,
        _ms(lambda: store_kv_triton(pools[2], pools[3], idx, k, v)),
        4 * t * HKV * D * 2,
        "GB/s",
    )
    for kind, name in ((0, "int8"), (1, "int4"), (2, "fp8")):
        _woq_rows(add, kind, name, 2 * inter, h)
    return rows


def _woq_rows(add: Callable[..., None], kind: int, name: str, n_out: int, k_in: int, group: int = 128) -> None:
    """Weight-only quantized GEMM (an 8B model's gate/up projection), next to bf16 F.linear."""
    codes = torch.randint(0, 256, (n_out, k_in // 2 if kind == 1 else k_in), dtype=torch.uint8, device="cuda")
    if kind == 2:
        codes = torch.randn(n_out, k_in, device="cuda").to(torch.float8_e4m3fn).view(torch.uint8)
    scale = torch.rand(n_out, k_in // group, device="cuda") * 0.01
    zero = torch.full_like(scale, 8.0 if kind == 1 else 0.0)
    dense = woq_dequantize_ref(codes, scale, zero, k_in, group, kind).to(DT)
    for m in (1, 16, 512):
        x = torch.randn(m, k_in, dtype=DT, device="cuda")
        err = _err(woq_matmul_triton(x, codes, scale, zero, group, kind), x @ dense.T)
        ms = _ms(functools.partial(woq_matmul_triton, x, codes, scale, zero, group, kind))
        bf16_ms = _ms(functools.partial(torch.matmul, x, dense.T))
        add(
            f"woq_matmul {name}",
            f"M={m} N={n_out} K={k_in} (bf16 {bf16_ms:.3f} ms)",
            err,
            2e-2,
            ms,
            codes.numel() + m * (k_in + n_out) * 2,
            "GB/s",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for gpu_check.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_check needs a CUDA GPU; on a CPU the kernels are tested under TRITON_INTERPRET=1 (pytest)")
    torch.manual_seed(0)
    peak = peaks()
    rows = checks()
    print(
        f"device: {torch.cuda.get_device_name()}  copy {peak['copy_GB_s']:.0f} GB/s  "
        f"bf16 matmul {peak['matmul_TFLOP_s']:.0f} TFLOP/s"
    )
    print(f"{'kernel':<18}{'shape':<28}{'rel err':>9}{'ok':>4}{'ms':>9}{'achieved':>12}{'of peak':>9}")
    for r in rows:
        top = peak["copy_GB_s"] if r["unit"] == "GB/s" else peak["matmul_TFLOP_s"]
        print(
            f"{r['kernel']:<18}{r['shape']:<28}{r['rel_err']:>9.1e}{'y' if r['ok'] else 'N':>4}{r['ms']:>9.3f}"
            f"{r['rate']:>8.0f} {r['unit']:<4}{100 * r['rate'] / top:>7.0f}%"
        )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(
            json.dumps({"device": torch.cuda.get_device_name(), **peak, "kernels": rows}, indent=1)
        )
    if not all(r["ok"] for r in rows):
        sys.exit("some kernel differs from its reference")


if __name__ == "__main__":
    main()
