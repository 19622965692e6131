import pytest
from tests.apps.attribution.lab import Lab
from apps.attribution.models import *

pytestmark = pytest.mark.django_db

def test_smoke():
    lab = Lab({"control": 1.0, "b": 1.10}, runs_per_arm=3, min_samples_per_arm=30)
    for i in range(40):
        lab.step()
        r = lab.tick()
        if r.frozen: 
            print("frozen at", i, r)
            break
    for s in AttributionSnapshot.objects.filter(arm=lab.arms["b"]).order_by("-window_end")[:1]:
        print(s.deviation, s.deviation_low, s.deviation_high, s.evidence)
    print(FreezeEvent.objects.all().values())
    print(WeightChange.objects.all().values_list("kind","old_weight","new_weight","reason")[:5])
