"""Revoke API tokens: by id, or every token of a tenant with a given name."""

from django.core.management.base import BaseCommand, CommandError

from apps.api.models import ApiToken
from apps.api.services import api_token_revoke


class Command(BaseCommand):
    help = "Revoke API tokens (they stop working at once; the rows stay for audit)."

    def add_arguments(self, parser):
        parser.add_argument("--id", type=int, help="Token id.")
        parser.add_argument("--tenant", help="Tenant slug (with --name).")
        parser.add_argument("--name", help="Token name (with --tenant).")

    def handle(self, *args, id, tenant, name, **options):
        if id is not None:
            tokens = ApiToken.objects.filter(pk=id)
        elif tenant and name:
            tokens = ApiToken.objects.filter(
                tenant__slug=tenant, name=name, revoked_at__isnull=True
            )
        else:
            raise CommandError("give --id, or --tenant and --name")
        tokens = list(tokens)
        if not tokens:
            raise CommandError("no such token")
        for token in tokens:
            api_token_revoke(token=token)
            self.stdout.write(
                f"revoked token {token.pk} '{token.name}' of tenant {token.tenant_id}"
            )
