from django.conf import settings
from rest_framework.pagination import PageNumberPagination


class ApiPagination(PageNumberPagination):
    """?page=N&page_size=M; page_size is capped at COSTLAB_API_MAX_PAGE_SIZE (a larger ask gets the
    cap)."""

    page_size_query_param = "page_size"
    page_size_query_description = "Items per page (capped at COSTLAB_API_MAX_PAGE_SIZE)."

    @property
    def page_size(self) -> int:
        return settings.COSTLAB_API_PAGE_SIZE

    @property
    def max_page_size(self) -> int:
        return settings.COSTLAB_API_MAX_PAGE_SIZE

    def get_paginated_response_schema(self, schema):
        response = super().get_paginated_response_schema(schema)
        response["required"] = ["count", "results"]
        return response
