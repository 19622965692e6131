"""Sign-in lockouts (django-axes): per username and address, plus a higher bound per address.

Axes counts failures for each combination in AXES_LOCKOUT_PARAMETERS but holds every combination
to the one AXES_FAILURE_LIMIT. The bound on one address over all usernames (a password spray)
must be higher than the per-username one, since an office behind one NAT shares an address, so it
is counted here: the failures from the address still inside the cool-off window, whatever the
username, against COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT. A successful sign-in clears only its own
username's failures, so an attacker who owns one account cannot clear the address's count.
"""

from __future__ import annotations

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum


def address_failures(request) -> int:
    """Failed sign-ins from the request's address within the cool-off, over every username."""
    if request.axes_ip_address is None:
        return 0
    attempts = AccessAttempt.objects.filter(ip_address=request.axes_ip_address)
    if settings.AXES_COOLOFF_TIME is not None:
        attempts = attempts.filter(attempt_time__gte=get_cool_off_threshold(request))
    return attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0


class SigninLockoutHandler(AxesDatabaseHandler):
    """Axes' database handler, which also locks an address out once it reaches its own bound.

    An address lockout sets ``request.costlab_address_lockout`` to that bound, so the lockout
    page (frontend/templates/locked_out.html) says which limit was reached.
    """

    def get_failures(self, request, credentials: dict | None = None) -> int:
        failures = super().get_failures(request, credentials)
        limit = get_failure_limit(request, credentials)
        address_limit = settings.COSTLAB_LOGIN_ADDRESS_FAILURE_LIMIT
        if failures < limit and address_failures(request) >= address_limit:
            request.costlab_address_lockout = address_limit
            return limit  # axes compares with its one limit: reaching it locks the request out
        return failures
