import pytest

from workers.tasks import ping

pytestmark = [pytest.mark.services, pytest.mark.slow]


def test_a_real_worker_answers_the_ping_task(celery_worker_process):
    assert ping.delay().get(timeout=30) == "pong"
