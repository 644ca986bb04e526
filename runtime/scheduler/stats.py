"""SchedulerStats: the scheduler's running totals (/metrics and the stats message keep these names)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SchedulerStats:
    """Totals since start. The disaggregated sides add their transfer counts to the same object."""

    prefill_steps: int = 0
    decode_steps: int = 0
    retractions: int = 0
    prompt_tokens: int = 0  # of admitted requests (the cache's own lookups are not traffic)
    cached_tokens: int = 0  # of those prompt tokens, how many came from the prefix cache
    generated_tokens: int = 0
    forced_tokens: int = 0  # written by a grammar's jump-forward, not sampled
    failed_batches: int = 0
    spec_verify_steps: int = 0
    spec_request_steps: int = 0  # requests with guesses, summed over verify steps
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    kv_transfers: int = 0
    kv_transfer_bytes: int = 0
    kv_transfer_seconds: float = 0.0
    kv_transfer_failures: int = 0
    bootstrap_rejected: int = 0

    def as_floats(self) -> dict[str, float]:
        """Every total by its name, as the stats message carries them."""
        return {k: float(v) for k, v in asdict(self).items()}
