"""The browser dashboard, mounted at the site root."""

from django.urls import path

from apps.dashboard import views

app_name = "dashboard"

urlpatterns = [
    path("", views.experiment_list, name="experiments"),
    path("login/", views.DashboardLoginView.as_view(), name="login"),
    path("logout/", views.DashboardLogoutView.as_view(), name="logout"),
    path("experiments/<int:pk>/", views.experiment_detail, name="experiment"),
    path("experiments/<int:pk>/comparison/", views.experiment_comparison, name="experiment-comparison"),
    path("experiments/<int:pk>/live.json", views.experiment_live, name="experiment-live"),
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/live.json", views.run_live, name="run-live"),
    path("pricing/", views.pricing, name="pricing"),
    path("sweeps/", views.sweep_list, name="sweeps"),
    path("sweeps/<int:pk>/", views.sweep_detail, name="sweep"),
    path("sweeps/<int:pk>/live.json", views.sweep_live, name="sweep-live"),
]
