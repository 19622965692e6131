"""Celery tasks: thin entry points that call app services and gpu_runtime."""
