# AlertChannel, AlertDelivery and BudgetEvent now belong to the alerts app, which took them over
# in its 0001_initial (on the same tables). State only: their tables, rows, indexes and
# constraints stay as they are; only attribution's state forgets them. The delivery goes first:
# it names the budget event.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('alerts', '0001_initial'),
        ('attribution', '0008_cursor_epoch_sums'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(name='AlertDelivery'),
                migrations.DeleteModel(name='AlertChannel'),
                migrations.DeleteModel(name='BudgetEvent'),
            ],
        ),
    ]
