"""The browser dashboard, mounted at the site root."""

from django.urls import path

from apps.dashboard import (
    views,
    views_alerts,
    views_authoring,
    views_runs,
    views_sweeps,
    views_tokens,
)

app_name = "dashboard"

urlpatterns = [
    path("", views.experiment_list, name="experiments"),
    path("login/", views.DashboardLoginView.as_view(), name="login"),
    path("logout/", views.DashboardLogoutView.as_view(), name="logout"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path(
        "experiments/<int:pk>/comparison/",
        views.experiment_comparison,
        name="experiment-comparison",
    ),
    path("experiments/<int:pk>/live.json", views.experiment_live, name="experiment-live"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/live.json", views.run_live, name="run-live"),
    path("runs/<int:pk>/artifacts/<str:name>", views_runs.run_artifact, name="run-artifact"),
    path("pricing/", views.pricing, name="pricing"),
    path("devices/", views.devices, name="devices"),
    path("sweeps/", views.sweep_list, name="sweeps"),
    path("sweeps/<int:pk>/", views.sweep_detail, name="sweep"),
    path("sweeps/<int:pk>/live.json", views.sweep_live, name="sweep-live"),
    path("sweeps/<int:pk>/promote/", views_sweeps.sweep_promote_view, name="sweep-promote"),
    path("sweeps/<int:pk>/cancel/", views_sweeps.sweep_cancel_view, name="sweep-cancel"),
    # Authoring in the browser, the runs page, compare, CSV exports, spend.
    path("experiments/new/", views_authoring.experiment_new, name="experiment-new"),
    path("experiments/<int:pk>/edit/", views_authoring.experiment_edit, name="experiment-edit"),
    path("experiments/<int:pk>/runs/new/", views_authoring.runs_new, name="runs-new"),
    path(
        "experiments/<int:pk>/comparison.csv",
        views_runs.experiment_comparison_csv,
        name="experiment-comparison-csv",
    ),
    path("runs/", views_runs.run_list, name="runs"),
    path("runs.csv", views_runs.run_list_csv, name="runs-csv"),
    path("runs/compare/", views_runs.run_compare, name="runs-compare"),
    path("runs/<int:pk>/cancel/", views_authoring.run_cancel_view, name="run-cancel"),
    path("runs/<int:pk>/labels/", views_authoring.run_annotate_view, name="run-annotate"),
    path(
        "experiments/<int:pk>/cancel-runs/",
        views_authoring.experiment_runs_cancel_view,
        name="experiment-cancel-runs",
    ),
    path("spend/", views_runs.spend, name="spend"),
    path("reconciliation/", views_runs.reconciliation_view, name="reconciliation"),
    path("reconciliation.csv", views_runs.reconciliation_csv_view, name="reconciliation-csv"),
    path("tokens/", views_tokens.tokens, name="tokens"),
    path(
        "experiments/<int:pk>/alert-channels/",
        views_alerts.alert_channel_add,
        name="alert-channel-add",
    ),
    path(
        "alert-channels/<int:pk>/test/",
        views_alerts.alert_channel_test_view,
        name="alert-channel-test",
    ),
    path(
        "alert-channels/<int:pk>/delete/",
        views_alerts.alert_channel_delete,
        name="alert-channel-delete",
    ),
    path("tokens/<int:pk>/revoke/", views_tokens.token_revoke, name="token-revoke"),
    path("sweeps/new/", views_authoring.sweep_new, name="sweep-new"),
]
