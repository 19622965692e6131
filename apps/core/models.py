from django.db import models


class TimeStampedModel(models.Model):
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


class PeriodicTaskRun(models.Model):
    """The latest run of a beat task, one row per task: when it started and how long it took.

    Read by /metrics (attribution tick duration and lag) and by operators in the admin."""

    name = models.CharField(primary_key=True, max_length=100)
    last_started_at = models.DateTimeField()
    last_duration_s = models.FloatField()
    runs = models.PositiveBigIntegerField(default=0)

    def __str__(self) -> str:
        return (
            f"{self.name}: last started {self.last_started_at:%Y-%m-%d %H:%M:%S} "
            f"({self.last_duration_s:.3f} s)"
        )
