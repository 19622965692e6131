"""Sending what a run left in its spool (the site was down when it ended), and ending the run
as it ended: ``python -m costlab resend DIR`` or ``costlab.resend(DIR)``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from costlab.client import Client
from costlab.delivery import Outbox, Refused, Spool, say

PENDING = "pending.json"  # written by Run when it leaves a spool behind


def resend(
    spool_dir: str | os.PathLike[str],
    *,
    url: str | None = None,
    token: str | None = None,
    retry_for_s: float = 300.0,
) -> dict:
    """Deliver a left spool (creating the run first if it never was), end the run as the process
    that left it ended, and delete the spool. Returns {run_id, sent, refused, status, dropped}.

    Where the run had already ended (finished from elsewhere; its run key names an ended run),
    the server takes none of the samples, now or ever: they are `dropped` (counted, said on
    stderr), `status` says how the run ended, and the spool is deleted all the same. Anything
    else that fails is raised and the spool kept, for another try."""
    path = Path(spool_dir)
    pending = json.loads((path / PENDING).read_text(encoding="utf-8"))
    client = Client(url, token)
    sent = refused = dropped = 0
    status = None
    try:
        run_id = pending["run_id"]
        outbox = Outbox(capacity=0, spool=Spool.reopen(path))
        try:
            if run_id is None:
                run_id = client.create_run(
                    pending["create"], arm_name=pending.get("arm_name"), retry_for_s=retry_for_s
                )["id"]
            while True:
                batch, where = outbox.peek(1000)
                if not batch:
                    break
                try:
                    answer = client.call(
                        "POST",
                        f"runs/{run_id}/telemetry/",
                        {"samples": batch},
                        retry_for_s=retry_for_s,
                    )
                except Refused as exc:
                    if exc.status not in (400, 422):
                        raise
                    say(f"run {run_id}: a batch of {len(batch)} samples was refused: {exc.reason}")
                    refused += len(batch)
                    answer = None
                n = len((answer or {}).get("refused") or [])
                sent, refused = sent + len(batch) - n if answer else sent, refused + n
                outbox.ack(batch, where)
        except Refused as exc:
            status = exc.run_ended
            if status is None:
                raise
            dropped = outbox.discard()
            which = f"run {run_id}" if run_id is not None else f"run key {pending['run_key']!r}"
            say(
                f"{which} had already ended ({status}), and the server takes no more of its "
                f"samples: {dropped} dropped, {path} removed"
            )
        else:
            outbox.spool.close()
            finish = pending.get("finish")
            if finish is not None:
                status = client.end_run(run_id, finish["status"], finish.get("error", ""))["status"]
    finally:
        client.close()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "run_id": run_id,
        "sent": sent,
        "refused": refused,
        "status": status,
        "dropped": dropped,
    }
