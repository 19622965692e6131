"""docker-compose.yml parses and holds every service (validated offline; no engine here)."""

import shutil
import subprocess

import pytest
import yaml

from tests.conftest import IN_CI
from tests.helpers import ROOT

pytestmark = pytest.mark.slow  # docker-compose config in a process

EXPECTED = {
    "postgres",
    "redis",
    "web",
    "worker",
    "platform-worker",
    "alerts-worker",
    "gpu-worker",
    "beat",
}


def test_compose_file_is_valid_and_complete():
    tool = shutil.which("docker-compose")
    if tool is None:
        if IN_CI:
            pytest.fail(
                "docker-compose is not installed (Debian package docker-compose); CI needs it"
            )
        pytest.skip("docker-compose is not installed (Debian package docker-compose)")
    out = subprocess.run(
        [tool, "-f", str(ROOT / "docker-compose.yml"), "--profile", "gpu", "config"],
        cwd=ROOT,
        env={"DJANGO_SECRET_KEY": "compose-validation-only", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    assert EXPECTED <= set(config["services"])
    for name in EXPECTED:
        assert "healthcheck" in config["services"][name], name
    images = {
        config["services"][n].get("build", {}).get("dockerfile")
        for n in EXPECTED - {"postgres", "redis"}
    }
    assert images == {"platform/Dockerfile"}
    assert config["services"]["gpu-worker"]["profiles"] == ["gpu"]
    assert "pgdata" in config["volumes"]
    # the training workers share torch.compile's graphs on the host (and through Redis)
    for name in ("worker", "gpu-worker"):
        service = config["services"][name]
        assert any("/app/var/compile-cache" in str(v) for v in service["volumes"]), name
        assert service["environment"]["TORCHINDUCTOR_CACHE_DIR"].startswith("/app/var/compile-")
    assert "--appendonly" in config["services"]["redis"]["command"]
    assert "alerts" in config["services"]["alerts-worker"]["command"]
