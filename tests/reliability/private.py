"""Private Postgres clusters and Redis servers that a test may stop, kill and restart at will.

Real servers on free ports in a temporary directory, never the shared ones. Postgres refuses to
run as root: as root, its commands run as the `postgres` user (runuser).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reachable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.3):
            return True
    except OSError:
        return False


class PrivatePostgres:
    """initdb + pg_ctl on a free port; `restart` stops it the hard way (immediate),
    as a crash does."""

    def __init__(self):
        bindir = (
            shutil.which("pg_config")
            and subprocess.run(
                ["pg_config", "--bindir"], capture_output=True, text=True
            ).stdout.strip()
        )
        if not bindir or not Path(bindir, "initdb").exists():
            pytest.skip("a private Postgres cluster needs initdb and pg_ctl (pg_config --bindir)")
        self.bin = Path(bindir)
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.dir = Path(tempfile.mkdtemp(prefix="costlab-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        if self.as_user:
            shutil.chown(self.dir, "postgres")
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "costlab")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/costlab"

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run(
            [*self.as_user, str(self.bin / tool), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.dir,
        )
        if out.returncode:
            raise RuntimeError(f"{tool} failed ({out.returncode}): {out.stderr.strip()[-800:]}")

    def start(self) -> None:
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )
        wait_for(lambda: _reachable(self.port), 30, "the private Postgres to listen")

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self, down_s: float) -> None:
        self.stop()
        time.sleep(down_s)
        self.start()

    def load_schema_of(self, settings_dict: dict) -> None:
        """Copy the test database's schema (every migration applied) into this cluster:
        faster than migrating."""
        env = dict(os.environ, PGPASSWORD=settings_dict.get("PASSWORD") or "")
        dump = subprocess.run(
            [
                str(self.bin / "pg_dump"),
                "--schema-only",
                "--no-owner",
                "--no-privileges",
                "-h",
                settings_dict["HOST"] or "127.0.0.1",
                "-p",
                str(settings_dict["PORT"] or 5432),
                "-U",
                settings_dict["USER"],
                settings_dict["NAME"],
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=True,
        ).stdout
        migrations = subprocess.run(
            [
                str(self.bin / "pg_dump"),
                "--data-only",
                "--table=django_migrations",
                "--table=django_content_type",
                "-h",
                settings_dict["HOST"] or "127.0.0.1",
                "-p",
                str(settings_dict["PORT"] or 5432),
                "-U",
                settings_dict["USER"],
                settings_dict["NAME"],
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=True,
        ).stdout
        subprocess.run(
            [str(self.bin / "psql"), "-q", "-v", "ON_ERROR_STOP=1", self.url],
            input=dump + migrations,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )

    def query(self, sql: str, *params):
        import psycopg

        with psycopg.connect(self.url, connect_timeout=3) as conn:
            return conn.execute(sql, params).fetchall()

    def close(self) -> None:
        try:
            self.stop("fast")
        except Exception:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A redis-server on a free port; `kill` is kill -9;
    `start` again keeps the data only when persistent."""

    def __init__(self, *, persistent: bool):
        if not shutil.which("redis-server"):
            pytest.skip("a private Redis needs redis-server")
        self.persistent = persistent
        self.dir = Path(tempfile.mkdtemp(prefix="costlab-redis-"))
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None
        self.start()

    def start(self) -> None:
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
            if self.persistent
            else ["--appendonly", "no", "--save", ""]
        )
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                *persistence,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: _reachable(self.port), 20, "the private Redis to listen")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
