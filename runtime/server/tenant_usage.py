"""Per-tenant usage counters: what a tenant key may read about the server (its own traffic only).

The global counters (/metrics, the scheduler's stats) show every tenant's traffic, so only the
admin key reads them; a tenant reads these, counted in the server process from its own
finished requests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

from arbor.runtime.io.outputs import GenerateOutput

MAX_TENANTS = 4096  # keys come from files, so this is a guard, not a limit anyone should meet


@dataclass
class Usage:
    """One tenant's finished requests (samples) and their tokens, since the server started."""

    num_requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0


class TenantUsage:
    """Usage per tenant id, the least recently active tenant forgotten beyond `max_tenants`."""

    def __init__(self, max_tenants: int = MAX_TENANTS) -> None:
        self.max_tenants = max_tenants
        self._usage: OrderedDict[str | None, Usage] = OrderedDict()

    async def counted(
        self, outputs: AsyncIterator[GenerateOutput], tenant: str | None
    ) -> AsyncIterator[GenerateOutput]:
        """Pass outputs through, adding each finished sample to `tenant`'s usage."""
        async for out in outputs:
            meta = out.meta_info
            if meta.finish_reason is not None:
                usage = self._of(tenant)
                usage.num_requests += 1
                usage.prompt_tokens += meta.prompt_tokens
                usage.generation_tokens += meta.completion_tokens
                usage.cached_tokens += meta.cached_tokens
            yield out

    def of(self, tenant: str | None) -> dict[str, int]:
        """`tenant`'s counters (zeros before its first finished request)."""
        return asdict(self._usage.get(tenant, Usage()))

    def all(self) -> dict[str, dict[str, int]]:
        """Every remembered tenant's counters, by tenant id (for the admin; an open server has none)."""
        return {tenant: asdict(usage) for tenant, usage in self._usage.items() if tenant is not None}

    def _of(self, tenant: str | None) -> Usage:
        usage = self._usage.get(tenant)
        if usage is None:
            usage = self._usage[tenant] = Usage()
            while len(self._usage) > self.max_tenants:
                self._usage.popitem(last=False)
        self._usage.move_to_end(tenant)
        return usage
