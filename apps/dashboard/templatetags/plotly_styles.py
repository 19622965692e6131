"""{% plotly_styles %}: plotly.js's styles as a static file, before plotly.min.js, so it inserts no
<style>."""

from django import template
from django.templatetags.static import static
from django.utils.html import format_html, format_html_join

from apps.dashboard.plotly_css import injected_style_ids

register = template.Library()


@register.simple_tag
def plotly_styles() -> str:
    href = static("dashboard/plotly.css")
    # plotly.js skips its own <style> when an element of this id has the class no-inline-styles; the
    # libraries it bundles (maplibre: maps, not drawn here) skip theirs when any element of their id
    # exists.
    marks = format_html_join(
        "", '<span hidden id="{}"></span>', ((i,) for i in injected_style_ids())
    )
    return format_html(
        '<link id="plotly.js-style-global" class="no-inline-styles" rel="stylesheet" href="{}">{}',
        href,
        marks,
    )
