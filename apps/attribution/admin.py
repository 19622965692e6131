from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import OuterRef, Subquery
from django.template.response import TemplateResponse

from apps.attribution.models import (
    AttributionSnapshot,
    AttributionWindow,
    FreezeEvent,
    FrozenArm,
    WeightChange,
)
from apps.attribution.services import arm_unfreeze
from apps.core.admin import ReadOnlyAdmin
from apps.core.exceptions import ApplicationError
from apps.experiments.models import Arm


@admin.register(FreezeEvent)
class FreezeEventAdmin(ReadOnlyAdmin):
    list_display = [
        "created_at",
        "experiment",
        "arm",
        "action",
        "deviation",
        "deviation_low",
        "threshold",
        "actor",
    ]
    list_filter = ["action"]
    list_select_related = ["experiment", "arm", "actor"]


@admin.register(AttributionSnapshot)
class AttributionSnapshotAdmin(ReadOnlyAdmin):
    list_display = [
        "computed_at",
        "experiment",
        "arm",
        "usd_per_mtok",
        "deviation",
        "deviation_low",
        "state",
        "cost_usd",
        "compared_usd",
        "pricing_valid_from",
    ]
    list_select_related = ["experiment", "arm"]


@admin.register(WeightChange)
class WeightChangeAdmin(ReadOnlyAdmin):
    list_display = ["created_at", "arm", "kind", "old_weight", "new_weight", "actor", "reason"]
    list_filter = ["kind"]
    list_select_related = ["arm", "actor"]


@admin.register(AttributionWindow)
class AttributionWindowAdmin(ReadOnlyAdmin):
    list_display = ["window_end", "experiment", "number", "status", "observations", "skip_reason"]
    list_filter = ["status"]
    list_select_related = ["experiment"]


class UnfreezeForm(forms.Form):
    reason = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        max_length=2000,
        help_text="Why these arms get traffic again. Kept in the audit log and alerted.",
    )


@admin.register(FrozenArm)
class FrozenArmAdmin(admin.ModelAdmin):
    """Frozen arms, and the one way staff give them traffic again: unfreeze with a reason."""

    list_display = ["name", "experiment", "frozen_at", "frozen_because", "weight"]
    list_select_related = ["experiment"]
    search_fields = ["name", "experiment__name"]
    actions = ["unfreeze"]

    def get_queryset(self, request):
        last = FreezeEvent.objects.filter(
            arm=OuterRef("pk"), action=FreezeEvent.Action.FREEZE
        ).order_by("-pk")
        return (
            super()
            .get_queryset(request)
            .filter(state=Arm.State.FROZEN)
            .annotate(
                frozen_at=Subquery(last.values("created_at")[:1]),
                frozen_because=Subquery(last.values("reason")[:1]),
            )
        )

    @admin.display(description="frozen at", ordering="frozen_at")
    def frozen_at(self, obj):
        return obj.frozen_at

    @admin.display(description="why (the evidence is in the freeze log)")
    def frozen_because(self, obj):
        return obj.frozen_because

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in Arm._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.action(description="Unfreeze selected arms (asks for a reason)", permissions=["change"])
    def unfreeze(self, request, queryset):
        form = UnfreezeForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            done = 0
            for arm in queryset.order_by("pk"):
                try:
                    arm_unfreeze(arm=arm, actor=request.user, reason=form.cleaned_data["reason"])
                    done += 1
                except ApplicationError as exc:
                    self.message_user(request, f"{arm}: {exc.message}", messages.ERROR)
            if done:
                self.message_user(
                    request,
                    f"Unfroze {done} arm(s); the reason is in the freeze log.",
                    messages.SUCCESS,
                )
            return None
        return TemplateResponse(
            request,
            "admin/attribution/unfreeze.html",
            {
                **self.admin_site.each_context(request),
                "title": "Unfreeze arms",
                "arms": queryset,
                "form": form,
                "opts": self.model._meta,
                "action_checkbox_name": ACTION_CHECKBOX_NAME,
            },
        )
