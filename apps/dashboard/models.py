"""The dashboard's own read model: telemetry rolled up into fixed blocks of seqs.

Downsampling a million samples per page view is too slow in SQL window functions (tens of
seconds); rolling each settled block of SEQS samples up once, and charting from the blocks,
makes a page's cost depend on the number of blocks, not of samples. A block is written once
every sample in it is settled (seq <= the run's priced_seq) and never changes after.
Changing SEQS needs a migration that empties the table (the blocks are rebuilt on the next views).
"""

from django.db import models

from apps.experiments.models import Run

# The telemetry series a chart can show; each has min, max, sum and count columns here.
CHART_FIELDS = (
    "util_pct",
    "power_w",
    "step_time_s",
    "micro_batch",
    "tokens_per_s",
    "loss",
    "mem_used_mb",
    # NVML GPM (Hopper and later), in %; blocks of runs without them have _n = 0 (not drawn).
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_bw_pct",
    # Where the run was (its step, its cumulative tokens): not charted themselves, the x axis a
    # chart can be drawn against instead of time. Blocks rolled up before these have _n = 0.
    "step",
    "tokens",
)


def _stat() -> models.FloatField:
    return models.FloatField(null=True)


class SeriesBlock(models.Model):
    """Samples with seq in [block * SEQS, (block + 1) * SEQS) of one run, summarised."""

    SEQS = 64

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="+")
    block = models.BigIntegerField()
    samples = models.IntegerField()
    ts_first = models.DateTimeField()
    ts_last = models.DateTimeField()
    estimated = models.BooleanField(
        default=False, help_text="Some power/energy in the block was modelled."
    )
    util_pct_min, util_pct_max, util_pct_sum, util_pct_n = (
        _stat(),
        _stat(),
        _stat(),
        models.IntegerField(default=0),
    )
    power_w_min, power_w_max, power_w_sum, power_w_n = (
        _stat(),
        _stat(),
        _stat(),
        models.IntegerField(default=0),
    )
    step_time_s_min, step_time_s_max = _stat(), _stat()
    step_time_s_sum, step_time_s_n = _stat(), models.IntegerField(default=0)
    micro_batch_min, micro_batch_max = _stat(), _stat()
    micro_batch_sum, micro_batch_n = _stat(), models.IntegerField(default=0)
    tokens_per_s_min, tokens_per_s_max = _stat(), _stat()
    tokens_per_s_sum, tokens_per_s_n = _stat(), models.IntegerField(default=0)
    loss_min, loss_max, loss_sum, loss_n = _stat(), _stat(), _stat(), models.IntegerField(default=0)
    # Blocks rolled up before memory was charted have mem_used_mb_n = 0: their memory is not drawn.
    mem_used_mb_min, mem_used_mb_max = _stat(), _stat()
    mem_used_mb_sum, mem_used_mb_n = _stat(), models.IntegerField(default=0)
    sm_occupancy_pct_min, sm_occupancy_pct_max = _stat(), _stat()
    sm_occupancy_pct_sum, sm_occupancy_pct_n = _stat(), models.IntegerField(default=0)
    tensor_active_pct_min, tensor_active_pct_max = _stat(), _stat()
    tensor_active_pct_sum, tensor_active_pct_n = _stat(), models.IntegerField(default=0)
    dram_bw_pct_min, dram_bw_pct_max = _stat(), _stat()
    dram_bw_pct_sum, dram_bw_pct_n = _stat(), models.IntegerField(default=0)
    step_min, step_max, step_sum, step_n = _stat(), _stat(), _stat(), models.IntegerField(default=0)
    tokens_min, tokens_max = _stat(), _stat()
    tokens_sum, tokens_n = _stat(), models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "block"], name="seriesblock_unique_run_block")
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} block {self.block}"
