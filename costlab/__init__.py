"""costlab's SDK: price training that runs elsewhere (your cluster, your loop, ``transformers``'
Trainer, Lightning) as an external run of an A/B experiment.

    import costlab

    with costlab.track(experiment=12, arm="bf16") as run:  # or assign=True: the server picks
        for batch in loader:
            loss = step(batch)
            run.log(tokens=costlab.trained_tokens(batch), loss=loss)

A token is a trained target (``costlab.tokens``): padding, -100 labels and each row's first token
are not counted, in every integration. Callbacks: ``costlab.integrations.transformers.
CostlabCallback`` and ``costlab.integrations.lightning.CostlabCallback`` (``run=`` adopts a run
started here). An assigned arm's declared keys as ``TrainingArguments``, never over the script's
own: ``costlab.to_trainer_args`` (or the Trainer callback's ``apply``). A spool left by an
outage: ``python -m costlab resend DIR``.

Needs httpx only (psutil and nvidia-ml-py when present); imports neither Django nor torch.

**One run, one telemetry stream per rank.** A job of N processes (torchrun, Lightning DDP,
accelerate) is one run: every rank submits the same run key and the server answers each with the
same run. Each rank then samples *its own* device (the visible GPU of its LOCAL_RANK, or its
process on the CPU) and sends it as its own stream, ``rank`` set in every sample:

- attribution per device: the bill sums device time and energy over the streams, so a GPU idling
  while another works, or one drawing more power, is billed as it was, not as rank 0's copy;
- no double counting: a device is read by exactly one process (rank 0 reading all of a node's
  GPUs would read them again on every node's rank 0, and miss the other nodes);
- no coordination: a rank's n-th sample has seq ``n * WORLD_SIZE + rank``, so the ranks share the
  run's seq space without talking, and each rank's stream rises with its seq.

Tokens and steps are the world's progress; the server counts them from rank 0 only. Every rank
reports the world's tokens: the framework's count where it keeps one (the Trainer's
``num_input_tokens_seen``), else its own times WORLD_SIZE. The arm's strategy should declare the
job's shape (``distributed: {nproc_per_node, nnodes}``): the server splits the run's GPUs, vCPUs
and memory over that many streams. Rank 0 finishes the run on success, after every rank's last
delivery (the ``barrier`` the callbacks pass); any rank ends it on failure or interrupt.
"""

from costlab.client import Unreachable
from costlab.delivery import Refused
from costlab.resend import resend
from costlab.run import Run, track
from costlab.strategy import TrainerArgs, to_trainer_args
from costlab.tokens import trained_tokens

__all__ = [
    "Refused",
    "Run",
    "TrainerArgs",
    "Unreachable",
    "resend",
    "to_trainer_args",
    "track",
    "trained_tokens",
]
__version__ = "0.1.0"
