# The alerts' models move here from attribution; their tables do not. State only: each model
# takes its old table by `db_table`, so no SQL runs and no row moves. Attribution's
# 0009_alerts_moved_out drops the old models from its state after this migration (it depends on
# it), so a fresh database (whose tables attribution's 0002 and 0006 create) and an existing one
# migrate alike. The content types are renamed too: the admin's log and any permission given on
# these models follow them.

import django.db.models.deletion
from django.db import migrations, models

MOVED = ['alertchannel', 'alertdelivery', 'budgetevent']


def content_types_to(app_label):
    source = 'attribution' if app_label == 'alerts' else 'alerts'

    def move(apps, schema_editor):
        ContentType = apps.get_model('contenttypes', 'ContentType')
        db = schema_editor.connection.alias
        taken = set(
            ContentType.objects.using(db)
            .filter(app_label=app_label, model__in=MOVED)
            .values_list('model', flat=True)
        )
        ContentType.objects.using(db).filter(
            app_label=source, model__in=[m for m in MOVED if m not in taken]
        ).update(app_label=app_label)

    return move


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('attribution', '0008_cursor_epoch_sums'),
        ('contenttypes', '0002_remove_content_type_name'),
        ('experiments', '0019_run_kernel_means'),
        ('tenants', '0003_budget_state'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.CreateModel(
                    name='BudgetEvent',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('month', models.DateField(help_text='The first day of the month the spend is of.')),
                        ('state', models.CharField(choices=[('warned', '80 % spent'), ('exceeded', 'Spent: runs stopped, submits refused')], max_length=16)),
                        ('spend_usd', models.DecimalField(decimal_places=6, help_text="The month's spend at the step.", max_digits=16, verbose_name='spend (USD)')),
                        ('budget_usd', models.DecimalField(decimal_places=2, help_text='monthly_budget_usd then.', max_digits=14, verbose_name='budget (USD)')),
                        ('reason', models.TextField()),
                        ('runs', models.JSONField(blank=True, default=dict, help_text='Run ids acted on: noted (80 %), cancelled (worker) and flagged (external).')),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('tenant', models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='budget_events', to='tenants.tenant')),
                    ],
                    options={
                        'db_table': 'attribution_budgetevent',
                        'ordering': ['-created_at'],
                        'indexes': [models.Index(fields=['tenant', 'created_at'], name='budgetevent_tenant_time_idx')],
                    },
                ),
                migrations.CreateModel(
                    name='AlertChannel',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('name', models.CharField(max_length=120)),
                        ('webhook_url', models.URLField(blank=True, default='', help_text='Receives a JSON POST per freeze/unfreeze (tenant-wide: and per budget step).')),
                        ('webhook_secret', models.CharField(blank=True, default='', help_text='Signs the body: X-Costlab-Signature: sha256=<hmac>.', max_length=128)),
                        ('email_recipients', models.TextField(blank=True, default='', help_text='Comma-separated e-mail addresses.')),
                        ('enabled', models.BooleanField(default=True)),
                        ('experiment', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='alert_channels', to='experiments.experiment')),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='alert_channels', to='tenants.tenant')),
                    ],
                    options={
                        'db_table': 'attribution_alertchannel',
                        'ordering': ['tenant', 'name'],
                        'constraints': [models.CheckConstraint(condition=models.Q(models.Q(('webhook_url', ''), _negated=True), models.Q(('email_recipients', ''), _negated=True), _connector='OR'), name='alertchannel_has_a_target')],
                    },
                ),
                migrations.CreateModel(
                    name='AlertDelivery',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('kind', models.CharField(choices=[('webhook', 'Webhook'), ('email', 'E-mail')], max_length=16)),
                        ('target', models.TextField(help_text='URL, or comma-separated addresses.')),
                        ('secret', models.CharField(blank=True, default='', max_length=128)),
                        ('payload', models.JSONField(default=dict)),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('sent', 'Sent'), ('failed', 'Failed')], default='pending', max_length=16)),
                        ('attempts', models.PositiveIntegerField(default=0)),
                        ('last_error', models.TextField(blank=True, default='')),
                        ('last_status_code', models.PositiveIntegerField(blank=True, null=True)),
                        ('next_attempt_at', models.DateTimeField(blank=True, null=True)),
                        ('delivered_at', models.DateTimeField(blank=True, null=True)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('event', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='attribution.freezeevent')),
                        ('budget_event', models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='deliveries', to='alerts.budgetevent')),
                    ],
                    options={
                        'verbose_name_plural': 'alert deliveries',
                        'db_table': 'attribution_alertdelivery',
                        'ordering': ['-created_at'],
                        'indexes': [models.Index(fields=['status', 'next_attempt_at'], name='alertdelivery_due_idx')],
                        'constraints': [
                            models.UniqueConstraint(fields=('event', 'kind', 'target'), name='alertdelivery_once_per_target'),
                            models.UniqueConstraint(fields=('budget_event', 'kind', 'target'), name='alertdelivery_budget_once_per_target'),
                            models.CheckConstraint(condition=models.Q(models.Q(('budget_event__isnull', True), ('event__isnull', False)), models.Q(('budget_event__isnull', False), ('event__isnull', True)), _connector='OR'), name='alertdelivery_one_event'),
                        ],
                    },
                ),
            ],
        ),
        migrations.RunPython(content_types_to('alerts'), content_types_to('attribution')),
    ]
