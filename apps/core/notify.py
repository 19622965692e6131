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


def listen(channel: str, on_message: Callable[[str], None]) -> Callable[[], None] | None:
    """Call on_message for every message on channel, from a daemon thread;
    returns a stop function."""
    if not push_enabled():
        return None
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    try:
        pubsub.subscribe(channel)
    except redis.RedisError as exc:
        logger.warning("subscribe to %s failed (%s); polling only", channel, exc)
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
                data = message["data"]
                on_message(data.decode() if isinstance(data, bytes) else str(data))
        pubsub.close()
        client.close()

    threading.Thread(target=loop, name=f"listen-{channel}", daemon=True).start()
    return stopped.set
