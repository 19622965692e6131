from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from apps.core.views import healthz
from apps.ops.views import metrics

admin.site.site_header = "costlab administration"
admin.site.site_title = "costlab admin"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Pages without the <link rel="icon"> (the admin, Swagger UI) make browsers ask here.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/", include("apps.api.urls")),
    path("", include("apps.dashboard.urls")),
]
