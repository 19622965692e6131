from django.contrib import admin
from django.http import HttpResponseRedirect
from django.templatetags.static import static
from django.urls import include, path

from apps.core.views import healthz
from apps.ops.views import metrics

admin.site.site_header = "costlab administration"
admin.site.site_title = "costlab admin"

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    # Pages without the <link rel="icon"> (the admin, Swagger UI) make browsers ask here.
    # A temporary redirect, resolved per request: the hashed name changes with the file
    # (collectstatic).
    path(
        "favicon.ico", lambda request: HttpResponseRedirect(static("favicon.svg")), name="favicon"
    ),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/", include("apps.api.urls")),
    path("", include("apps.dashboard.urls")),
]
