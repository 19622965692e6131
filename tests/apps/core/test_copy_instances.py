"""copy_instances (COPY) stores what bulk_create (Django's INSERT) stores, decimals included:
a Decimal goes to Postgres as it is (as Django's own path sends it), a float through Django."""

from __future__ import annotations

from decimal import Decimal

import pytest

from apps.attribution.models import RunCursor
from apps.core.db import copy_instances

pytestmark = pytest.mark.django_db

VALUES = [Decimal("0.1234565"), Decimal("-2.5000005"), Decimal("12345"), 0.1, 1 / 3, 7]


def test_copy_stores_what_bulk_create_stores():
    base = 10**12
    by_copy = [
        RunCursor(run_id=base + i, window_id=1, epoch_cost_usd=v) for i, v in enumerate(VALUES)
    ]
    by_insert = [
        RunCursor(run_id=base + 100 + i, window_id=1, epoch_cost_usd=v)
        for i, v in enumerate(VALUES)
    ]
    copy_instances(RunCursor, by_copy)
    RunCursor.objects.bulk_create(by_insert)
    stored = dict(
        RunCursor.objects.filter(run_id__gte=base).values_list("run_id", "epoch_cost_usd")
    )
    copied = [stored[base + i] for i in range(len(VALUES))]
    inserted = [stored[base + 100 + i] for i in range(len(VALUES))]
    assert copied == inserted
    assert copied[:2] == [Decimal("0.123457"), Decimal("-2.500001")]  # rounded by the column
