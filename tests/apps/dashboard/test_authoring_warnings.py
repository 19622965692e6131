"""Warnings at authoring in the browser: an arm saved with a dtype that every measured device of a
training queue emulates (or runs slower than fp32) is saved, and the next page says so, naming the
arm and the key."""

from html import unescape

import pytest
from django.urls import reverse

from apps.devices.services import device_profile_record
from apps.experiments.models import Experiment
from tests.apps.dashboard.test_authoring import GOOD, form_data
from tests.factories import EPYC_AVX2, XEON_AMX, device_profile

pytestmark = pytest.mark.django_db

BF16 = GOOD + "precision: {compute_dtype: bf16}\n"
WARNING = "Arm 'bf16': precision.compute_dtype: bf16 runs at 0.02x fp32 on cpu"


def record(cpu) -> None:
    device_profile_record(host="worker-1", label="cpu", queues=["cpu"], profile=device_profile(cpu))


def create(member, w):
    response = member.post(
        reverse("dashboard:experiment-new"),
        form_data(w, arms=(("fp32", GOOD, True), ("bf16", BF16, False))),
        follow=True,
    )
    assert response.status_code == 200 and response.redirect_chain, "saved and redirected"
    experiment = Experiment.objects.get(name="browser-made")
    assert response.redirect_chain[-1][0] == reverse("dashboard:experiment", args=[experiment.pk])
    assert experiment.arms.get(name="bf16").strategy_yaml == BF16, "a warning never blocks a save"
    return unescape(response.content.decode())


def test_saving_bf16_where_the_cpu_emulates_it_warns_naming_the_arm_and_the_key(member, w):
    record(EPYC_AVX2)
    page = create(member, w)
    assert "Experiment 'browser-made' created." in page
    assert WARNING in page, "the notice names the arm and the key"
    assert "(AMD EPYC 7B13, no avx512_bf16/amx_bf16): expect it dearer" in page
    assert "(on the cpu queue, 1 measured)" in page
    assert page.count("precision.compute_dtype") == 1, "the fp32 arm is not warned about"
    assert 'class="notice notice-warning message-warning"' in page


def test_no_warning_where_the_cpu_runs_bf16_natively(member, w):
    record(XEON_AMX)
    page = create(member, w)
    assert "Experiment 'browser-made' created." in page
    assert "precision.compute_dtype" not in page and "message-warning" not in page


def test_editing_an_arm_to_bf16_warns_after_the_save(member, w):
    record(EPYC_AVX2)
    url = reverse("dashboard:experiment-edit", args=[w.experiment.pk])
    data = form_data(
        w,
        arms=(("baseline", GOOD, True), ("optimized", BF16, False)),
        **{
            "arms-INITIAL_FORMS": "2",
            "arms-0-arm_id": str(w.control.pk),
            "arms-1-arm_id": str(w.candidate.pk),
        },
    )
    data.pop("tenant")
    response = member.post(url, data, follow=True)
    assert response.redirect_chain, response.context and response.context["form"].errors
    page = unescape(response.content.decode())
    assert "saved." in page
    assert "Arm 'optimized': precision.compute_dtype: bf16 runs at" in page
    assert "Arm 'baseline'" not in page
    w.candidate.refresh_from_db()
    assert w.candidate.strategy_yaml == BF16
