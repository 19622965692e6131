"""Mint an API token for one tenant and print it once (only its digest is stored)."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.api.services import api_token_create
from apps.core.exceptions import ApplicationError
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Mint an API token scoped to one tenant; the secret is printed once and never stored."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="Tenant slug.")
        parser.add_argument("--name", required=True, help="Which client holds it, e.g. github-ci.")
        parser.add_argument(
            "--expires-days",
            type=int,
            default=None,
            help="Days until it expires (default COSTLAB_API_TOKEN_TTL_DAYS).",
        )
        parser.add_argument(
            "--no-expiry", action="store_true", help="Never expires (revoke it by hand)."
        )
        parser.add_argument(
            "--created-by", default=None, help="Username recorded as its creator (audit)."
        )

    def handle(self, *args, tenant, name, expires_days, no_expiry, created_by, **options):
        found = Tenant.objects.filter(slug=tenant).first()
        if found is None:
            raise CommandError(f"--tenant: no tenant with slug '{tenant}'")
        user = None
        if created_by:
            user = get_user_model().objects.filter(username=created_by).first()
            if user is None:
                raise CommandError(f"--created-by: no user '{created_by}'")
        try:
            token, secret = api_token_create(
                tenant=found,
                name=name,
                created_by=user,
                no_expiry=no_expiry,
                ttl=timedelta(days=expires_days) if expires_days is not None else None,
            )
        except ApplicationError as exc:
            raise CommandError(exc.message) from None
        expiry = f"expires {token.expiry:%Y-%m-%d %H:%M} UTC" if token.expiry else "never expires"
        self.stderr.write(
            f"token {token.pk} '{token.name}' for tenant '{found.slug}', {expiry}. "
            "Store it now: it is not shown again."
        )
        self.stdout.write(secret)
