"""Staff keep pricing in the admin: pages load, bad prices get a field error, nothing half-saves."""

from decimal import Decimal

import pytest
from django.contrib import admin
from django.urls import reverse

from apps.pricing.models import GpuPrice, PricingTable
from tests.factories import (
    ArmFactory,
    GpuPriceFactory,
    GpuSkuFactory,
    RunFactory,
    TenantFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client(client):
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


def all_changelist_urls():
    return [
        reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for model in admin.site._registry
    ]


def test_anonymous_users_are_sent_to_login(client):
    for url in all_changelist_urls():
        response = client.get(url)
        assert response.status_code == 302, url
        assert reverse("admin:login") in response["Location"]


def test_every_admin_page_loads_for_staff(staff_client):
    GpuPriceFactory()
    run = RunFactory()
    ArmFactory(experiment=run.experiment)
    for url in all_changelist_urls():
        assert staff_client.get(url).status_code == 200, url
    for name, obj in (("experiments_run", run), ("experiments_experiment", run.experiment)):
        assert staff_client.get(reverse(f"admin:{name}_change", args=[obj.pk])).status_code == 200


def _pricing_form(tenant, sku, **overrides):
    data = {
        "tenant": tenant.pk,
        "name": "Q3 prices",
        "currency": "USD",
        "valid_from_0": "2026-07-01",
        "valid_from_1": "00:00:00",
        "electricity_usd_per_kwh": "0.12",
        "pue": "1.3",
        "vcpu_hour_usd": "0.04",
        "memory_gb_hour_usd": "0.005",
        "notes": "",
        "gpu_prices-TOTAL_FORMS": "1",
        "gpu_prices-INITIAL_FORMS": "0",
        "gpu_prices-MIN_NUM_FORMS": "0",
        "gpu_prices-MAX_NUM_FORMS": "1000",
        "gpu_prices-0-sku": sku.pk,
        "gpu_prices-0-hourly_usd": "3.10",
    }
    data.update(overrides)
    return data


def test_staff_can_add_a_pricing_table_with_gpu_prices(staff_client):
    tenant, sku = TenantFactory(), GpuSkuFactory()
    response = staff_client.post(
        reverse("admin:pricing_pricingtable_add"), _pricing_form(tenant, sku)
    )
    assert response.status_code == 302, response.content[:2000]
    table = PricingTable.objects.get(tenant=tenant)
    assert table.gpu_prices.get().hourly_usd == Decimal("3.10")


@pytest.mark.parametrize(
    "field, value",
    [
        ("electricity_usd_per_kwh", "-0.10"),
        ("electricity_usd_per_kwh", ""),
        ("vcpu_hour_usd", "-1"),
        ("pue", "0.5"),
        ("gpu_prices-0-hourly_usd", "-3"),
        ("gpu_prices-0-hourly_usd", ""),
    ],
)
def test_bad_prices_get_a_field_error_and_nothing_is_saved(staff_client, field, value):
    tenant, sku = TenantFactory(), GpuSkuFactory()
    response = staff_client.post(
        reverse("admin:pricing_pricingtable_add"), _pricing_form(tenant, sku, **{field: value})
    )
    assert response.status_code == 200  # the form again, with errors
    if field.startswith("gpu_prices-"):
        errors = response.context["inline_admin_formsets"][0].formset.errors[0]
        assert "hourly_usd" in errors
    else:
        assert field in response.context["adminform"].form.errors
    assert not PricingTable.objects.filter(tenant=tenant).exists()
    assert not GpuPrice.objects.filter(sku=sku).exists()


def test_a_gpu_price_of_zero_needs_its_free_box_ticked(staff_client):
    """Issue 45: a price of 0 was accepted without a word."""
    tenant, sku = TenantFactory(), GpuSkuFactory()
    url = reverse("admin:pricing_pricingtable_add")
    refused = staff_client.post(url, _pricing_form(tenant, sku, **{"gpu_prices-0-hourly_usd": "0"}))
    assert refused.status_code == 200
    errors = refused.context["inline_admin_formsets"][0].formset.errors[0]
    assert "0 makes this GPU free" in str(errors["hourly_usd"])
    assert not PricingTable.objects.filter(tenant=tenant).exists()
    saved = staff_client.post(
        url,
        _pricing_form(
            tenant, sku, **{"gpu_prices-0-hourly_usd": "0", "gpu_prices-0-confirm_free": "on"}
        ),
    )
    assert saved.status_code == 302
    assert PricingTable.objects.get(tenant=tenant).gpu_prices.get().hourly_usd == 0


def test_freeze_events_are_read_only(staff_client):
    assert staff_client.get(reverse("admin:attribution_freezeevent_add")).status_code == 403


def test_arm_admin_refuses_a_bad_strategy_naming_the_key(staff_client):
    arm = ArmFactory()
    url = reverse("admin:experiments_arm_change", args=[arm.pk])
    form = {
        "experiment": arm.experiment_id,
        "name": arm.name,
        "weight": "1",
        "is_control": "",
        "strategy_yaml": arm.strategy_yaml
        + "optimizer: {dynamic_batching: {min_micro_batch: 0}}\n",
    }
    response = staff_client.post(url, form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["strategy_yaml"]
    assert any("optimizer.dynamic_batching.min_micro_batch" in e for e in errors)
    arm.refresh_from_db()
    assert "min_micro_batch" not in arm.strategy_yaml and arm.revision == 1


def test_arm_admin_strategy_edit_bumps_the_revision(staff_client):
    arm = ArmFactory()
    url = reverse("admin:experiments_arm_change", args=[arm.pk])
    form = {
        "experiment": arm.experiment_id,
        "name": arm.name,
        "weight": "2",
        "is_control": "",
        "strategy_yaml": arm.strategy_yaml + "telemetry: {interval_s: 0.5}\n",
    }
    assert staff_client.post(url, form).status_code == 302
    arm.refresh_from_db()
    assert (
        arm.revision == 2 and arm.weight == Decimal("2") and "interval_s: 0.5" in arm.strategy_yaml
    )


def test_arm_admin_strategy_and_name_edited_together_keep_the_new_revision(staff_client):
    """The admin used to bump the revision through the service, then save its stale copy over it."""
    arm = ArmFactory()
    url = reverse("admin:experiments_arm_change", args=[arm.pk])
    form = {
        "name": "renamed",
        "weight": "1",
        "is_control": "",
        "strategy_yaml": arm.strategy_yaml + "telemetry: {interval_s: 0.5}\n",
    }
    assert staff_client.post(url, form).status_code == 302
    arm.refresh_from_db()
    assert arm.revision == 2 and arm.name == "renamed" and "interval_s: 0.5" in arm.strategy_yaml


def test_arm_admin_stores_typed_yaml_as_the_file_has_it(staff_client):
    """A browser sends CRLF and no final newline; stored so,
    its SHA-256 never matched the file's."""
    from apps.experiments.models import Arm
    from apps.experiments.strategies import strategy_sha256

    arm = ArmFactory()
    file_text = arm.strategy_yaml.rstrip("\n") + "\ntelemetry: {interval_s: 0.5}\n"
    form = {
        "experiment": arm.experiment_id,
        "name": "typed",
        "weight": "0",
        "is_control": "",
        "strategy_yaml": file_text.replace("\n", "\r\n").rstrip("\r\n"),
    }
    assert staff_client.post(reverse("admin:experiments_arm_add"), form).status_code == 302
    typed = Arm.objects.get(experiment=arm.experiment, name="typed")
    assert typed.strategy_yaml == file_text and typed.strategy_sha256 == strategy_sha256(file_text)


def test_experiment_admin_inline_arms_save_their_strategy_through_the_services(staff_client):
    from apps.experiments.models import Arm

    arm = ArmFactory(is_control=True)
    exp = arm.experiment
    url = reverse("admin:experiments_experiment_change", args=[exp.pk])
    page = staff_client.get(url)
    form = {k: v for k, v in page.context["adminform"].form.initial.items() if v is not None}
    form.update(
        {
            "tenant": exp.tenant_id,
            "cost_model": exp.cost_model_id,
            "pricing_table": "",
            "target_steps": "",
            "status": exp.status,
            "freeze_policy": exp.freeze_policy,
            "arms-TOTAL_FORMS": "2",
            "arms-INITIAL_FORMS": "1",
            "arms-MIN_NUM_FORMS": "0",
            "arms-MAX_NUM_FORMS": "1000",
            "arms-0-id": str(arm.pk),
            "arms-0-experiment": str(exp.pk),
            "arms-0-name": arm.name,
            "arms-0-is_control": "on",
            "arms-0-weight": "1",
            "arms-0-strategy_yaml": arm.strategy_yaml + "telemetry: {interval_s: 0.5}\n",
            "arms-1-experiment": str(exp.pk),
            "arms-1-name": "inline",
            "arms-1-weight": "0",
            "arms-1-strategy_yaml": arm.strategy_yaml,
        }
    )
    response = staff_client.post(url, form)
    assert response.status_code == 302, (
        response.context["adminform"].form.errors if response.context else ""
    )
    arm.refresh_from_db()
    assert arm.revision == 2
    assert Arm.objects.get(
        experiment=exp, name="inline"
    ).strategy_yaml == arm.strategy_yaml.replace("telemetry: {interval_s: 0.5}\n", "")


def test_a_price_edit_of_a_table_in_force_keeps_the_old_prices_for_the_time_before(staff_client):
    tenant, sku = TenantFactory(), GpuSkuFactory()
    assert (
        staff_client.post(
            reverse("admin:pricing_pricingtable_add"), _pricing_form(tenant, sku)
        ).status_code
        == 302
    )
    table = PricingTable.objects.get(tenant=tenant)  # in force since 2026-07-01
    price = table.gpu_prices.get()
    url = reverse("admin:pricing_pricingtable_change", args=[table.pk])
    assert (
        "a price edit is saved as a new version from now" in staff_client.get(url).content.decode()
    )
    edit = _pricing_form(
        tenant,
        sku,
        **{
            "gpu_prices-INITIAL_FORMS": "1",
            "gpu_prices-0-id": price.pk,
            "gpu_prices-0-pricing_table": table.pk,
            "gpu_prices-0-hourly_usd": "6.00",
        },
    )
    PricingTable.objects.filter(pk=table.pk).update(is_example=True, name="Example prices")
    edit |= {"name": "Example prices", "is_example": "on"}
    response = staff_client.post(url, edit, follow=True)
    said = [str(m) for m in response.context["messages"]]
    # one message, the version's; not also Django's "was changed successfully" of the old table
    assert len(said) == 1 and said[0].startswith("Saved as a new version, 'Prices v2"), said
    table.refresh_from_db()
    version = PricingTable.objects.filter(tenant=tenant).exclude(pk=table.pk).get()
    # the edit is the user's prices: a name of its own and no example flag (the old one keeps both)
    assert (version.name, version.is_example) == ("Prices v2", False)
    assert (table.name, table.is_example) == ("Example prices", True)
    listed = staff_client.get(reverse("admin:pricing_pricingtable_changelist")).content.decode()
    assert f"{sku.name} 6" in listed and f"{sku.name} 3.1" in listed  # every price in the list
    assert "0.04" in listed and "0.005" in listed
    # The table edited keeps its start and prices: what was priced with it never moves.
    assert table.valid_from.isoformat().startswith("2026-07-01")
    assert table.gpu_prices.get().hourly_usd == Decimal("3.10")
    assert version.supersedes == table and version.valid_from > table.valid_from
    assert version.gpu_prices.get().hourly_usd == Decimal("6.00")
    # A superseded version is shown read-only.
    page = staff_client.get(url).content.decode()
    assert 'name="gpu_prices-0-hourly_usd"' not in page and 'name="pue"' not in page


def test_re_pricing_a_run_in_the_admin_is_audited_and_refused_while_it_runs(staff_client):
    from apps.telemetry.models import RunRepricing

    price = GpuPriceFactory()
    run = RunFactory(
        arm=ArmFactory(experiment__tenant=price.pricing_table.tenant), status="running"
    )
    url = reverse("admin:telemetry_runrepricing_add")
    refused = staff_client.post(url, {"run": run.pk, "reason": "new list"})
    assert (
        refused.status_code == 200
        and "only a finished run is re-priced" in refused.content.decode()
    )
    run.status = "succeeded"
    run.save(update_fields=["status"])
    assert (
        staff_client.post(
            url, {"run": run.pk, "pricing_table": price.pricing_table.pk, "reason": "new list"}
        ).status_code
        == 302
    )
    audit = RunRepricing.objects.get(run=run)
    assert (
        audit.actor.is_staff
        and audit.pricing_table == price.pricing_table
        and audit.reason == "new list"
    )
