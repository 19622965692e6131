from django.core.management.base import BaseCommand

from apps.demo.services import demo_seed


class Command(BaseCommand):
    help = "Seed example prices, a demo tenant and experiment, and an admin user (idempotent)."

    def add_arguments(self, parser):
        parser.add_argument("--admin-username", default="admin")
        parser.add_argument(
            "--submit-runs",
            type=int,
            default=0,
            metavar="N",
            help="Queue N runs per demo arm when the demo experiment has no runs yet.",
        )

    def handle(self, *args, admin_username: str, submit_runs: int, **options):
        result = demo_seed(admin_username=admin_username, submit_runs_per_arm=submit_runs)
        self.stdout.write(f"Demo tenant: {result.tenant.slug}; pricing: {result.pricing_table}")
        if result.runs_submitted:
            self.stdout.write(
                f"Queued {result.runs_submitted} demo runs on '{result.experiment.name}'."
            )
        if result.admin_password:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Admin user created: {result.admin_username} / password: "
                    f"{result.admin_password}  "
                    "(shown once; change it with: manage.py changepassword)"
                )
            )
        else:
            self.stdout.write(
                f"Admin user '{result.admin_username}' already exists; password unchanged "
                f"(reset it with: manage.py changepassword {result.admin_username})."
            )
