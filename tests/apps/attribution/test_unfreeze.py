"""Staff unfreeze a frozen arm with a reason; it is audited, and its evidence starts over."""

from decimal import Decimal

import pytest
from django.urls import reverse

from apps.attribution.models import AttributionSnapshot, FreezeEvent, WeightChange
from apps.attribution.say.snapshots import COMPARED_FIELDS, window_recompute
from apps.attribution.services import arm_unfreeze
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm
from tests.apps.attribution.lab import Lab
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def frozen_lab():
    # 300 samples a window (10 runs x 30): one window after an unfreeze is not evidence enough.
    lab = Lab({"control": 1.0, "b": 1.25}, seed=30, dynamic_weights=False, min_samples_per_arm=600)
    for _ in range(30):
        lab.step()
        if lab.tick().frozen:
            return lab
    raise AssertionError("b was never frozen")


def test_unfreeze_is_audited_and_restores_the_weight(frozen_lab):
    staff = UserFactory(is_staff=True)
    event = arm_unfreeze(
        arm=frozen_lab.arms["b"], actor=staff, reason="fixed the dataloader regression"
    )
    b = frozen_lab.arm("b")
    assert (b.state, b.weight) == (Arm.State.ACTIVE, Decimal("1.0000"))
    assert (event.action, event.actor, event.reason) == (
        FreezeEvent.Action.UNFREEZE,
        staff,
        "fixed the dataloader regression",
    )
    change = WeightChange.objects.get(arm=b, kind=WeightChange.Kind.UNFREEZE)
    assert (change.old_weight, change.new_weight, change.actor) == (0, Decimal("1.0000"), staff)
    assert list(
        FreezeEvent.objects.filter(arm=b).order_by("pk").values_list("action", flat=True)
    ) == ["freeze", "unfreeze"]


def test_an_unfrozen_arm_is_not_refrozen_on_the_evidence_that_froze_it(frozen_lab):
    arm_unfreeze(
        arm=frozen_lab.arms["b"], actor=UserFactory(is_staff=True), reason="checked by hand"
    )
    frozen_lab.step()
    frozen_lab.tick()
    snap = AttributionSnapshot.objects.filter(arm=frozen_lab.arms["b"]).latest("window_end")
    assert (
        snap.epoch_start == snap.window.number - 1 and snap.observations == 10
    )  # one window's worth
    assert frozen_lab.arm("b").state == Arm.State.ACTIVE
    assert snap.runs == 10  # the runs that go on count again, in the new epoch
    assert "samples: arm has 300 < min_samples_per_arm 600" in snap.evidence["blocked_by"]
    # Recomputing that window from the observations honours the restart too.
    for again in window_recompute(window=snap.window):
        stored = AttributionSnapshot.objects.get(window=snap.window, arm_id=again.arm_id)
        assert all(getattr(again, f) == getattr(stored, f) for f in COMPARED_FIELDS)
    # Still 25 % dearer: with new evidence it is frozen again.
    for _ in range(30):
        frozen_lab.step()
        if frozen_lab.tick().frozen:
            break
    assert frozen_lab.arm("b").state == Arm.State.FROZEN
    assert FreezeEvent.objects.filter(arm=frozen_lab.arms["b"], action="freeze").count() == 2


@pytest.mark.parametrize(
    ("actor", "reason", "message"),
    [
        ("staff", "  ", "reason: say why the arm is unfrozen"),
        ("user", "because", "actor: only staff can unfreeze an arm"),
        (None, "because", "actor: only staff can unfreeze an arm"),
    ],
)
def test_unfreeze_refuses_without_a_reason_or_by_non_staff(frozen_lab, actor, reason, message):
    users = {"staff": UserFactory(is_staff=True), "user": UserFactory(is_staff=False), None: None}
    with pytest.raises(ApplicationError, match=message):
        arm_unfreeze(arm=frozen_lab.arms["b"], actor=users[actor], reason=reason)
    assert frozen_lab.arm("b").state == Arm.State.FROZEN


def test_unfreeze_of_an_active_arm_is_refused(frozen_lab):
    with pytest.raises(ApplicationError, match="state: arm 'control' is not frozen"):
        arm_unfreeze(arm=frozen_lab.arms["control"], actor=UserFactory(is_staff=True), reason="x")


def test_the_admin_action_asks_for_a_reason_then_unfreezes(frozen_lab, client):
    staff = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(staff)
    url = reverse("admin:attribution_frozenarm_changelist")
    b = frozen_lab.arms["b"]
    page = client.get(url)
    assert page.status_code == 200 and b.name in page.content.decode()
    form = client.post(url, {"action": "unfreeze", "_selected_action": [b.pk]})
    assert form.status_code == 200 and "reason" in form.content.decode()
    missing = client.post(
        url, {"action": "unfreeze", "_selected_action": [b.pk], "apply": "1", "reason": ""}
    )
    assert missing.status_code == 200 and "This field is required" in missing.content.decode()
    assert frozen_lab.arm("b").state == Arm.State.FROZEN
    done = client.post(
        url,
        {
            "action": "unfreeze",
            "_selected_action": [b.pk],
            "apply": "1",
            "reason": "cost regression was a pricing typo",
        },
    )
    assert done.status_code == 302
    assert frozen_lab.arm("b").state == Arm.State.ACTIVE
    event = FreezeEvent.objects.get(arm=b, action=FreezeEvent.Action.UNFREEZE)
    assert (event.actor, event.reason) == (staff, "cost regression was a pricing typo")
