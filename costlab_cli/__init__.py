"""costlab's command line for CI pipelines. Depends on httpx and the standard library only."""

__version__ = "0.1.0"
