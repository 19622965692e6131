"""apps.core.db's Compiled and fields_save: the ORM's rows and writes, without its compile on
every call."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models import F
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from apps.core.db import Compiled, fields_save
from apps.experiments.models import Run
from tests.factories import RunFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _runs(**lookup):
    return (
        Run.objects.select_for_update(of=("self",))
        .select_related("experiment__cost_model", "gpu_sku")
        .annotate(tenant_budget=F("tenant__monthly_budget_usd"))
        .filter(**lookup)
    )


def test_a_compiled_read_gives_what_the_orm_gives_and_compiles_once(django_assert_num_queries):
    from django.db.models.sql.compiler import SQLCompiler

    one, two = RunFactory(cost_usd=Decimal("1.250000")), RunFactory()
    two.tenant.monthly_budget_usd = Decimal("77")
    two.tenant.save()
    read = Compiled(_runs)
    compiles = []
    original = SQLCompiler.as_sql

    def counted(self, *args, **kwargs):
        compiles.append(self.query.model)
        return original(self, *args, **kwargs)

    SQLCompiler.as_sql = counted
    try:
        with transaction.atomic():
            got = [read.get(pk=r.pk, tenant_id=r.tenant_id) for r in (one, two, one)]
            with django_assert_num_queries(1):  # the run, its experiment, cost model and SKU
                again = read.get(pk=two.pk, tenant_id=two.tenant_id)
    finally:
        SQLCompiler.as_sql = original
    assert len(compiles) == 1  # the first call's
    with transaction.atomic():
        expected = [_runs(pk=r.pk, tenant_id=r.tenant_id).get() for r in (one, two, one)]
    for a, b in zip(got, expected, strict=True):
        assert a.pk == b.pk and a.cost_usd == b.cost_usd == b.cost_usd.quantize(Decimal("1e-6"))
        assert a.created_at == b.created_at and a.created_at.tzinfo is not None
        assert a.config_yaml == b.config_yaml and a.cost_breakdown == b.cost_breakdown
        assert a.experiment.cost_model.pk == b.experiment.cost_model.pk
        assert a.gpu_sku_id == b.gpu_sku_id and a.tenant_budget == b.tenant_budget
    assert again.tenant_budget == Decimal("77")


def test_a_compiled_read_of_nothing_refuses_as_the_orm_does():
    run = RunFactory()
    read = Compiled(_runs)
    with transaction.atomic():
        with pytest.raises(Run.DoesNotExist):
            read.get(pk=run.pk, tenant_id=run.tenant_id + 1000)  # another tenant's
        assert read.all(pk=run.pk + 1000, tenant_id=run.tenant_id) == []
    with pytest.raises(TransactionManagementError):  # FOR UPDATE outside a transaction
        read.get(pk=run.pk, tenant_id=run.tenant_id)
    # A name the queryset does not pass as one parameter is said, not guessed.
    with pytest.raises(ImproperlyConfigured, match="tenant_id"):
        Compiled(lambda pk, tenant_id: Run.objects.filter(pk=pk)).all(pk=run.pk, tenant_id=1)


def test_fields_save_writes_what_save_writes():
    a, b = RunFactory(), RunFactory()
    names = ["cost_usd", "cost_breakdown", "tokens", "samples_from", "updated_at"]
    when = timezone.now() - timedelta(hours=1)
    for run in (a, b):
        run.cost_usd = Decimal("3.1415926")  # rounded by the column's places either way
        run.cost_breakdown = {"total_usd": 3.14, "unpriced_s": {"gpu": 1.5}}
        run.tokens, run.samples_from = 2**40, when
    before = timezone.now()
    fields_save(a, names)
    b.save(update_fields=names)
    a_, b_ = (Run.objects.values(*names).get(pk=r.pk) for r in (a, b))
    assert a_.pop("updated_at") >= before and b_.pop("updated_at") >= before  # auto_now
    assert a_ == b_ and a_["cost_usd"] == Decimal("3.141593")


def test_a_compiled_read_by_a_text_key_finds_only_its_rows():
    from apps.api.models import ApiToken
    from apps.api.services import api_token_create

    run = RunFactory()
    made = [api_token_create(tenant=run.tenant, name=f"ci {i}")[0] for i in range(2)]
    read = Compiled(
        lambda token_key: ApiToken.objects.filter(token_key=token_key).select_related("tenant")
    )
    for token in made:
        assert [(t.pk, t.tenant.pk) for t in read.all(token_key=token.token_key)] == [
            (token.pk, run.tenant_id)
        ]
    assert read.all(token_key="no such key") == []


def test_each_shape_compiles_once_and_a_read_survives_a_dropped_connection_and_a_thread():
    """The names a call passes pick the SQL (with or without the tenant's check); the SQL made
    on one connection runs on a new one (after a drop) and on another thread's."""
    import threading

    from django.db import connection

    one, other = RunFactory(), RunFactory()
    read = Compiled(_runs)
    with transaction.atomic():
        assert read.get(pk=one.pk).pk == one.pk  # no tenant's check: any tenant's run
        with pytest.raises(Run.DoesNotExist):
            read.get(pk=one.pk, tenant_id=other.tenant_id)
    assert len(read._done) == 2
    connection.close()  # as after a database restart: the next query opens a new one
    with transaction.atomic():
        assert read.get(pk=other.pk, tenant_id=other.tenant_id).pk == other.pk
    got = []

    def in_thread():
        try:
            with transaction.atomic():
                got.append(read.get(pk=one.pk, tenant_id=one.tenant_id).experiment.cost_model)
        finally:
            connection.close()

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join()
    assert [m.pk for m in got] == [one.experiment.cost_model.pk]
    assert len(read._done) == 2
