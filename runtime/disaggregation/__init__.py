"""Prefill/decode disaggregation: a prefill worker computes a prompt's KV and writes it into a
decode worker's pool (NIXL), which decodes; sglang-router's PD mode pairs them by room."""
