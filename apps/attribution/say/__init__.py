"""What is recorded and said: a decision's snapshot with its evidence, and a past window recomputed
the same way (`snapshots`), the per-arm report (`report`) and a freeze's or an unfreeze's alert
payload (`freeze_alerts`). Other apps read these through `apps.attribution.reads`.
"""
