"""Seed the instance catalogue (apps/pricing/catalogue/instance_types.json, version 1): the
instance types a FOCUS import prices through. Rows already there (edited in the admin) are kept."""

import json
from decimal import Decimal
from pathlib import Path

from django.db import migrations

CATALOGUE = Path(__file__).resolve().parent.parent / "catalogue" / "instance_types.json"


def seed(apps, schema_editor):
    InstanceType = apps.get_model("pricing", "InstanceType")
    catalogue = json.loads(CATALOGUE.read_text())
    for row in catalogue["instance_types"]:
        InstanceType.objects.get_or_create(
            name=row["name"],
            defaults={
                "provider": row["provider"],
                "gpu_sku_name": row["gpu_sku"],
                "gpu_count": row["gpus"],
                "vcpus": row["vcpus"],
                "memory_gib": Decimal(row["memory_gib"]),
                "catalogue_version": catalogue["version"],
            },
        )


def unseed(apps, schema_editor):
    InstanceType = apps.get_model("pricing", "InstanceType")
    InstanceType.objects.filter(catalogue_version=1).delete()


class Migration(migrations.Migration):
    dependencies = [("pricing", "0005_instancetype_focusimport")]

    operations = [migrations.RunPython(seed, unseed)]
