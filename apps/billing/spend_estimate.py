"""A running estimate of each tenant's month spend, shared by every process in Redis, so that a
priced batch does not sum the tenant's runs to learn that no budget step is near.

The exact figure (apps.experiments.selectors.tenant_month_spend) is a sum over every run the
tenant queued this month. Summed after every priced batch, as the budget check did, it took most
of Postgres at fleet scale: in bench/fleet.py (47,500 runs in one tenant, about 29 batches a
second) that sum was the running statement in 409 of 557 samples of Postgres' active queries
(AMD EPYC, 2 cores, bf16 emulated (slow)).

Now:
- the exact check seeds the estimate with the sum it made (`seed`, after `before_sum`);
- each priced batch adds its cost increase to it, rounded up to the micro-dollar (`add`);
- the budget check runs the exact sum only where the estimate reaches another state than the
  tenant's recorded one (apps.billing.services), or where there is no estimate: none yet, expired
  (TTL_S: what a re-price or a finish moved outside ingest is counted again then), or Redis is
  unreachable (then every batch sums, as before).

The estimate only errs high, a few batches' worth, never low, except for what other paths than
ingest adds within TTL_S. Keys name the database and the tenant's creation time, so two
deployments sharing a Redis, or a database restored or copied with the same ids, do not share
estimates.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from decimal import Decimal

from django.conf import settings
from django.db import connection

from apps.experiments.selectors import month_start
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

TTL_S = 60
MICRO = Decimal(1_000_000)
_said_at = -60.0
# Atomic: an increment lands only on an estimate that exists (one the exact sum seeded).
_ADD = """
if redis.call('exists', KEYS[1]) == 1 then return redis.call('incrby', KEYS[1], ARGV[1]) end
"""
_GET = "return redis.call('get', KEYS[1])"
# The exact sum, less what was in the estimate when the sum began: increments made while it ran
# stay counted (they may be in the sum too: the estimate errs high).
_SEED = """
local now = redis.call('get', KEYS[1])
if now and ARGV[2] ~= '' then
  return redis.call('incrby', KEYS[1], tonumber(ARGV[1]) - tonumber(ARGV[2]))
end
redis.call('set', KEYS[1], ARGV[1], 'EX', ARGV[3])
return tonumber(ARGV[1])
"""


@functools.cache
def _client(url: str):
    import redis

    # Short timeouts: an unreachable Redis costs a batch a fraction of a second, then the sum.
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def _key(tenant: Tenant) -> str:
    born = f"{tenant.created_at.timestamp():.6f}"
    database = connection.settings_dict["NAME"]
    return f"costlab:spend:{database}:{tenant.pk}:{born}:{month_start():%Y-%m}"


def _micro(usd: Decimal) -> int:
    return math.ceil(usd * MICRO)


def _run(script: str, key: str, *args) -> int | None:
    from redis.exceptions import RedisError

    try:
        found = _client(settings.REDIS_URL).eval(script, 1, key, *args)
    except (RedisError, OSError) as exc:
        global _said_at
        if time.monotonic() - _said_at >= 60:  # at most once a minute: every batch meets it
            _said_at = time.monotonic()
            logger.warning("spend estimate: Redis unreachable (%s); the exact sum is used", exc)
        return None
    return None if found is None else int(found)


def add(*, tenant: Tenant, usd: Decimal) -> Decimal | None:
    """Add a batch's cost increase; the estimate after it, or None where there is none."""
    found = _run(_ADD, _key(tenant), _micro(usd))
    return None if found is None else Decimal(found) / MICRO


def before_sum(*, tenant: Tenant) -> str:
    """The estimate as the exact sum begins ('' where there is none), for `seed`."""
    found = _run(_GET, _key(tenant))
    return "" if found is None else str(found)


def seed(*, tenant: Tenant, spent: Decimal, before: str) -> None:
    """Set the estimate from an exact sum begun when it was `before`."""
    _run(_SEED, _key(tenant), _micro(spent), before, TTL_S)
