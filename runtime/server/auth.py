"""API keys and tenants. Each key is a tenant: its own cache namespace, and only its own
requests to abort. The admin key may also flush the cache and abort any request. Keys come
from files or the environment, so none need be on a command line; they are compared in
constant time."""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass

from arbor.runtime.config import DisaggArgs, HttpArgs
from arbor.runtime.disaggregation.secret import require_secret

KEY_ENV = "ARBOR_API_KEY"
ADMIN_KEY_ENV = "ARBOR_ADMIN_API_KEY"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: its tenant id (None when the server has no keys) and rights."""

    tenant: str | None
    admin: bool
    pd: bool = False  # presented the PD secret: the router, which alone may set bootstrap fields and read the load


OPEN = Caller(tenant=None, admin=True)  # a server without keys: one tenant, all rights


@dataclass(frozen=True)
class Keys:
    """Tenant keys and the admin key; empty means the server is open."""

    tenants: tuple[str, ...]
    admin: str | None
    pd_secret: str | None = None

    @classmethod
    def load(cls, http: HttpArgs, disagg: DisaggArgs) -> Keys:
        """--api-key (or ARBOR_API_KEY) and every line of --api-key-file are tenants; the admin
        key is --admin-api-key-file's first line or ARBOR_ADMIN_API_KEY. With no admin key, a
        lone tenant key is also the admin key (the one-key server of before)."""
        first = http.api_key or os.environ.get(KEY_ENV)
        tenants = [first] if first else []
        if http.api_key_file:
            tenants += _lines(http.api_key_file)
        admin = os.environ.get(ADMIN_KEY_ENV) or None
        if http.admin_api_key_file:
            admin = next(iter(_lines(http.admin_api_key_file)), None)
        if admin is None and len(tenants) == 1:
            admin = tenants[0]
        pd_secret = require_secret(disagg) if disagg.mode != "null" else None
        return cls(tuple(dict.fromkeys(tenants)), admin, pd_secret)

    @property
    def enabled(self) -> bool:
        return bool(self.tenants or self.admin or self.pd_secret)

    def caller(self, authorization: str) -> Caller | None:
        """The caller an `Authorization: Bearer KEY` header names, or None for a wrong key.
        Every key is compared (constant time each), so timing tells nothing of which matched."""
        token = authorization.removeprefix("Bearer ").encode()
        tenant = None
        for key in self.tenants:
            if hmac.compare_digest(token, key.encode()):
                tenant = _tenant_id(key)
        admin = self.admin is not None and hmac.compare_digest(token, self.admin.encode())
        pd = self.pd_secret is not None and hmac.compare_digest(token, self.pd_secret.encode())
        if pd:  # the router: its clients share one namespace (it carries no tenant), and no admin rights
            return Caller(tenant=_tenant_id(token.decode()), admin=False, pd=True)
        if tenant is None and not admin:
            return None
        return Caller(tenant=tenant or _tenant_id(self.admin or ""), admin=admin)

    @property
    def first(self) -> str | None:
        """A key a local client (the demo) may use."""
        return self.tenants[0] if self.tenants else self.admin


def _tenant_id(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        keys = [line.strip() for line in f if line.strip()]
    if not keys:
        raise ValueError(f"the key file {path} holds no key")
    return keys
