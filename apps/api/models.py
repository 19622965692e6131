"""API clients: tokens bound to one tenant, stored as digests (knox's hashing), with expiry and
revocation."""

from django.conf import settings
from django.db import models
from django.utils import timezone
from knox.models import AbstractAuthToken
from knox.settings import CONSTANTS

from apps.tenants.models import Tenant


class ApiToken(AbstractAuthToken):
    """One client's token (a CI pipeline, a script). Only its digest is stored; the secret is shown
    once.

    The token acts for its tenant, with member rights, and for no one else: it is not tied to a
    person (`created_by` is kept for audit only), so a CI pipeline keeps working when its author
    leaves. Staff-only actions need a staff user's session, never a token.
    """

    # knox's abstract token belongs to a user and is keyed by its digest; ours belongs to a tenant
    # and has a plain id, so URLs and audit logs never carry the digest.
    id = models.BigAutoField(primary_key=True)
    digest = models.CharField(max_length=CONSTANTS.DIGEST_LENGTH, unique=True)
    user = None
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=80, help_text="Which client holds it, e.g. 'github-ci'.")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    objects = (
        models.Manager()
    )  # knox's manager mints per-user tokens; ours are minted by api_token_create

    class Meta:
        ordering = ["tenant", "-created"]
        verbose_name = "API token"
        indexes = [
            models.Index(fields=["tenant", "revoked_at"], name="apitoken_tenant_revoked_idx")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant}, {self.token_key}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def is_expired(self) -> bool:
        return self.expiry is not None and self.expiry <= timezone.now()
