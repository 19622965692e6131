import pytest

from tests.apps.dashboard.world import world


@pytest.fixture
def w(db):
    return world()


@pytest.fixture
def member(client, w):
    client.force_login(w.user)
    return client
