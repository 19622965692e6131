"""/api/: v1 resources, the OpenAPI schema and Swagger UI; anything else under /api/ is a JSON
404."""

from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.api.views.devices import DeviceViewSet
from apps.api.views.experiments import ArmViewSet, ExperimentViewSet
from apps.api.views.focus import FocusExportView, ReconciliationView
from apps.api.views.meta import ApiRouter, StrategySchemaView, WhoAmIView, api_not_found
from apps.api.views.pricing import CostModelViewSet, GpuSkuViewSet, PricingTableViewSet
from apps.api.views.runs import RunViewSet
from apps.api.views.sweeps import SweepViewSet
from apps.api.views.tokens import ApiTokenViewSet

app_name = "api"

router = ApiRouter(trailing_slash=True)  # GET /api/v1/ answers the API root
router.register("experiments", ExperimentViewSet, basename="experiment")
router.register("arms", ArmViewSet, basename="arm")
router.register("runs", RunViewSet, basename="run")
router.register("pricing-tables", PricingTableViewSet, basename="pricing-table")
router.register("cost-models", CostModelViewSet, basename="cost-model")
router.register("gpu-skus", GpuSkuViewSet, basename="gpu-sku")
router.register("devices", DeviceViewSet, basename="device")
router.register("tokens", ApiTokenViewSet, basename="token")
router.register("sweeps", SweepViewSet, basename="sweep")

v1 = [
    path("me/", WhoAmIView.as_view(), name="me"),
    path("strategy-schema/", StrategySchemaView.as_view(), name="strategy-schema"),
    path("focus/", FocusExportView.as_view(), name="focus"),
    path("reconciliation/", ReconciliationView.as_view(), name="reconciliation"),
    *router.urls,
]

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script as a file: no inline script (CSP script-src
    # 'self').
    path(
        "schema/swagger/",
        SpectacularSwaggerSplitView.as_view(url_name="api:schema"),
        name="swagger",
    ),
    path("v1/", include(v1)),
    re_path(r"^.*$", api_not_found),
]
