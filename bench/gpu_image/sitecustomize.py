"""Import only what the GPU machine will have: a CPU dry run of bench/gpu_check.sh puts this
folder first on PYTHONPATH, so Python imports this module at start (in every process the check
starts: the Celery worker, pytest, the benchmarks) and any third-party top-level module whose
distribution is in neither bench/gpu_image_packages.txt (the image) nor bench/gpu_requirements.txt
(the wheels the check carries) fails to import, as it would there. An optional import (celery's
greenlet, say) then takes its fallback, as there; a required one fails the step, here, first.

What an image package imports is the image's business (its own dependencies are there, at its own
versions, which need not be this venv's): only imports made by this checkout's code, or by a
carried wheel (installed with --no-deps, so its dependencies must be listed too), are judged.

GPU_IMAGE_IMPORTS_LOG=<dir>: each process writes the third-party top-level modules it imported,
and those it was refused, to <dir>/<pid>.txt at exit (tests/bench/test_gpu_imports.py reads them).
"""

from __future__ import annotations

import atexit
import functools
import importlib.metadata
import os
import sys
from pathlib import Path

from gpu_image_lists import IMAGE_LIST, canonical, listed_distributions  # beside this file

_PROJECT = "costlab"  # this checkout's own packages (config, apps, gpu_runtime ...)


@functools.cache
def _tops() -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(top-level module, its distributions) installed here: read once (a tenth of a second)."""
    return tuple((t, tuple(d)) for t, d in importlib.metadata.packages_distributions().items())


def refused_modules(allowed: set[str]) -> set[str]:
    """Top-level modules installed here that only distributions outside `allowed` provide."""
    allowed = allowed | {_PROJECT}
    return {
        top
        for top, dists in _tops()
        if top not in sys.stdlib_module_names and not any(canonical(d) in allowed for d in dists)
    }


def _importer() -> str:
    """The top-level package of the module whose import statement is being run."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith("<frozen") or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    name = (frame.f_globals.get("__name__") or "") if frame is not None else ""
    return name.split(".")[0]


class _ImageOnly:
    def __init__(self, refused: set[str], image: set[str]):
        self.refused = refused
        # top-level modules of image distributions, installed here: their imports are not judged
        self.image_modules = {
            top for top, dists in _tops() if any(canonical(d) in image for d in dists)
        }
        self.tried: set[str] = set()

    def find_spec(self, name, path=None, target=None):
        if path is None and name in self.refused and _importer() not in self.image_modules:
            self.tried.add(name)
            raise ModuleNotFoundError(
                f"No module named {name!r} (not on the GPU image, nor in "
                "bench/gpu_requirements.txt: bench/gpu_image/sitecustomize.py)",
                name=name,
            )
        return None


def _log(finder: _ImageOnly, folder: str) -> None:
    modules = dict(sys.modules)
    # Loaded from a file: not the stdlib, not private, not a module an extension made up at run
    # time (Cython's cython_runtime has neither spec nor file; kombu's lazy module has a file).
    imported = sorted(
        top
        for top in {n.split(".")[0] for n in modules}
        if top not in sys.stdlib_module_names
        and not top.startswith("_")
        and (
            getattr(modules.get(top), "__spec__", None) is not None
            or getattr(modules.get(top), "__file__", None) is not None
        )
    )
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        Path(folder, f"{os.getpid()}.txt").write_text(
            "\n".join(
                [
                    *(f"imported {n}" for n in imported),
                    *(f"refused {n}" for n in sorted(finder.tried)),
                ]
            )
            + "\n"
        )
    except OSError:
        pass


_finder = _ImageOnly(refused_modules(listed_distributions()), listed_distributions(IMAGE_LIST))
sys.meta_path.insert(0, _finder)
if os.environ.get("GPU_IMAGE_IMPORTS_LOG"):
    atexit.register(_log, _finder, os.environ["GPU_IMAGE_IMPORTS_LOG"])
