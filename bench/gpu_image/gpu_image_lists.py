"""The two lists of what the GPU machine will have, read: the image's distributions
(bench/gpu_image_packages.txt) and the carried wheels (bench/gpu_requirements.txt). No side
effects, so tests read it without installing sitecustomize's import refusal."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent
IMAGE_LIST = BENCH / "gpu_image_packages.txt"
CARRIED_LIST = BENCH / "gpu_requirements.txt"


def canonical(name: str) -> str:
    """A distribution's name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def listed_distributions(*paths: Path) -> set[str]:
    """The distribution names of requirement-style lists (pins, comments and blanks allowed)."""
    names = set()
    for path in paths or (IMAGE_LIST, CARRIED_LIST):
        for line in Path(path).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                names.add(canonical(re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0]))
    return names
