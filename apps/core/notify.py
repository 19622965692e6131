"""Push notifications between processes: Redis pub/sub on the full stack.

With the embedded default (no Redis) publishing does nothing and listeners are not
started; workers fall back to polling the database once a second. No caller needs to
know which: both paths end in the same database read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

ARM_REVISIONS = "costlab:arm-revisions"  # "<arm id>:<revision>", once a revision is committed
RUN_CANCELS = "costlab:run-cancels"  # "<run id>,<run id>...", once their cancel is committed


def push_enabled() -> bool:
    return bool(settings.REDIS_URL) and settings.COSTLAB_PUSH_NOTIFICATIONS


def publish(channel: str, message: str) -> None:
    if not push_enabled():
        return
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        client.publish(channel, message)
        client.close()
    except redis.RedisError as exc:  # a missed push only costs the polling delay
        logger.warning(
            "publish to %s failed (%s); listeners will see the change by polling", channel, exc
        )


def publish_on_commit(channel: str, message: str) -> None:
    """Publish once the current transaction commits (at once outside one): a listener that is
    woken reads the database, and must find the change there."""
    transaction.on_commit(lambda: publish(channel, message))


def listen(handlers: dict[str, Callable[[str], None]]) -> Callable[[], None] | None:
    """Call handlers[channel](message) for every message on those channels, from one daemon thread
    on one connection; returns a stop function."""
    if not push_enabled():
        return None
    import redis

    names = ", ".join(handlers)
    client = redis.Redis.from_url(settings.REDIS_URL)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(*handlers)
    except redis.RedisError as exc:
        logger.warning("subscribe to %s failed (%s); polling only", names, exc)
        return None
    stopped = threading.Event()

    def loop() -> None:
        while not stopped.is_set():
            try:
                message = pubsub.get_message(timeout=0.5)
            except redis.RedisError:
                stopped.wait(1.0)
                continue
            if message and message.get("type") == "message":
                channel, data = (
                    v.decode() if isinstance(v, bytes) else str(v)
                    for v in (message["channel"], message["data"])
                )
                handlers[channel](data)
        pubsub.close()
        client.close()

    threading.Thread(target=loop, name=f"listen-{names}", daemon=True).start()
    return stopped.set
