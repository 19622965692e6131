from django.contrib import admin
from django.urls import include, path

from apps.core.views import healthz
from apps.ops.views import metrics

admin.site.site_header = "costlab administration"
admin.site.site_title = "costlab admin"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/", include("apps.api.urls")),
    path("", include("apps.dashboard.urls")),
]
