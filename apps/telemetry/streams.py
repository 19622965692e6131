"""One sampler per rank of a run: the first SDK sampler to send for a rank holds it.

Each process (rank) of an external run sends its samples with seq ``n * world_size + rank``, so
two samplers streaming one rank (a run started by ``costlab.track`` and again by a callback with
the same run key, or two processes given one rank) send the same seqs, and the server would keep
whichever arrived first: an idle sampler's step-0 samples instead of the training's. So every SDK
sample names its sampler (`stream`), the run records the first stream of each rank, and a batch
from another stream of that rank is refused whole, saying which run and rank and what to do.
A spool resent later carries its own stream id and is taken. Samples without a stream (costlab's
own workers, `costlab upload`) are not checked.
"""

from __future__ import annotations

from apps.core.db import fields_save
from apps.core.exceptions import ApplicationError


def streams_claim(*, run, samples: list[dict]) -> None:
    """Record the stream of each rank the batch is the first to send for; refuse (409) a batch
    with another stream for a rank already held. Caller holds the run's row lock."""
    sent = {(s["rank"], s["stream"]) for s in samples if s.get("stream")}
    if not sent:
        return
    held = dict(run.streams or {})
    fresh = False
    for rank, stream in sorted(sent):
        holder = held.get(str(rank))
        if holder is None:
            held[str(rank)] = stream
            fresh = True
        elif holder != stream:
            raise ApplicationError(
                f"stream: run {run.pk} rank {rank} is already streamed by another sampler "
                f"({holder[:8]}…, not this {stream[:8]}…): one sampler per rank, or the same seqs "
                "arrive twice and only the first copy is kept. Hand the started run to the "
                "callback (CostlabCallback(run=run)) instead of tracking it twice, and give each "
                "process its own rank",
                {"fields": {"stream": ["a second sampler for this rank"]}, "rank": rank},
                code="second_sampler",
                status=409,
            )
    if fresh:
        run.streams = held
        fields_save(run, ["streams"])
