"""One DDP rank's process: ``python -m gpu_runtime.rank WORKDIR``, started by torch's elastic agent.

``record`` writes an uncaught exception to the agent's error file, so the run's error names
this rank and the exception, not only an exit code.
"""

import sys

from torch.distributed.elastic.multiprocessing.errors import record

from gpu_runtime.distributed import rank_main

if __name__ == "__main__":
    record(rank_main)(sys.argv[-1])
