"""One abstract base (UsageTotals) for the totals of RunWindow, RunCursor and AttributionSnapshot: one
name for the billed cost, one width per total (the widest, a snapshot's)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('attribution', '0003_comparison_table'),
    ]

    operations = [
        # The snapshot's billed total takes the name the run totals use (kept, not re-added).
        migrations.RenameField(
            model_name='attributionsnapshot',
            old_name='total_usd',
            new_name='cost_usd',
        ),
        migrations.AlterField(
            model_name='attributionsnapshot',
            name='cost_usd',
            field=models.DecimalField(decimal_places=6, default=0, help_text='As billed: each run at the tables in force while it ran.', max_digits=16),
        ),
        migrations.AlterField(
            model_name='attributionsnapshot',
            name='gpu_seconds',
            field=models.DecimalField(decimal_places=6, default=0, help_text='Device-seconds (GPU, or CPU for CPU runs).', max_digits=24),
        ),
        migrations.AlterField(
            model_name='runcursor',
            name='cost_usd',
            field=models.DecimalField(decimal_places=6, default=0, help_text='As billed: each run at the tables in force while it ran.', max_digits=16),
        ),
        migrations.AlterField(
            model_name='runcursor',
            name='energy_j',
            field=models.DecimalField(decimal_places=6, default=0, max_digits=28),
        ),
        migrations.AlterField(
            model_name='runcursor',
            name='gpu_seconds',
            field=models.DecimalField(decimal_places=6, default=0, help_text='Device-seconds (GPU, or CPU for CPU runs).', max_digits=24),
        ),
        migrations.AlterField(
            model_name='runcursor',
            name='wall_s',
            field=models.DecimalField(decimal_places=6, default=0, max_digits=24),
        ),
        migrations.AlterField(
            model_name='runwindow',
            name='cost_usd',
            field=models.DecimalField(decimal_places=6, default=0, help_text='As billed: each run at the tables in force while it ran.', max_digits=16),
        ),
        migrations.AlterField(
            model_name='runwindow',
            name='energy_j',
            field=models.DecimalField(decimal_places=6, default=0, max_digits=28),
        ),
        migrations.AlterField(
            model_name='runwindow',
            name='gpu_seconds',
            field=models.DecimalField(decimal_places=6, default=0, help_text='Device-seconds (GPU, or CPU for CPU runs).', max_digits=24),
        ),
        migrations.AlterField(
            model_name='runwindow',
            name='wall_s',
            field=models.DecimalField(decimal_places=6, default=0, max_digits=24),
        ),
    ]
