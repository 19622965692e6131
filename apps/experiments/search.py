"""Tags and notes on runs and experiments, and the one search over runs that the runs page and
the API share (`q`): a run's name (its run_key), a tag, its notes, a git commit prefix, or a
strategy key (`precision.compute_dtype` or `precision.compute_dtype=bf16`).

Tags are stored comma-separated ("baseline,pr-123"), so one indexed text column serves SQLite and
Postgres alike; a tag matches whole (`(^|,)tag(,|$)`), never as a substring of another tag.
"""

from __future__ import annotations

import re

from django.db.models import Q, QuerySet

from apps.core.exceptions import ApplicationError

TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,39}$")
MAX_TAGS = 20
MAX_NOTE = 10_000
CONFIG_KEY = re.compile(r"^([a-z_]+(?:\.[a-z_]+)+)(?:=(.+))?$")


def tags_normalise(tags, *, field: str = "tags") -> str:
    """The stored form of a list of tags (or a comma-separated string): each 1-40 characters of
    letters, digits and _.:/- (starting with a letter or digit), at most 20, duplicates dropped
    (order kept). Errors name the field, its index and the reason."""
    if isinstance(tags, str):
        tags = [t for t in (p.strip() for p in tags.split(",")) if t]
    if not isinstance(tags, (list, tuple)):
        raise ApplicationError(f"{field}: a list of tags", code="invalid")
    out: list[str] = []
    for i, tag in enumerate(tags):
        tag = str(tag).strip()
        if not TAG.match(tag):
            raise ApplicationError(
                f"{field}[{i}]: {tag!r} is not a tag (1-40 letters, digits and _.:/-, starting "
                "with a letter or digit)",
                {"fields": {field: [f"item {i}: not a tag"]}},
                code="invalid",
            )
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise ApplicationError(
            f"{field}: {len(out)} tags, at most {MAX_TAGS}",
            {"fields": {field: ["too many"]}},
            code="invalid",
        )
    return ",".join(out)


def tags_of(stored: str) -> list[str]:
    return [t for t in stored.split(",") if t] if stored else []


def note_check(note: str, *, field: str = "note") -> str:
    note = (note or "").strip()
    if len(note) > MAX_NOTE:
        raise ApplicationError(
            f"{field}: {len(note)} characters, at most {MAX_NOTE}",
            {"fields": {field: ["too long"]}},
            code="invalid",
        )
    return note


def runs_search(runs: QuerySet, q: str) -> QuerySet:
    """The runs matching `q`: by name (run_key, contains), tag (whole), note or platform notes
    (contains), git commit (prefix, hexadecimal), or a strategy key (`a.b` or `a.b=value`: the
    strategy YAML sets the key's last part, to that value if given)."""
    q = (q or "").strip()
    if not q:
        return runs
    key = CONFIG_KEY.match(q)
    if key:
        leaf, value = key.group(1).rsplit(".", 1)[-1], key.group(2)
        match = Q(config_yaml__iregex=rf"(^|[\s{{,]){re.escape(leaf)}:")
        if value is not None:
            v = re.escape(value.strip())
            match &= Q(
                config_yaml__iregex=rf"(^|[\s{{,]){re.escape(leaf)}:\s*['\"]?{v}['\"]?(\s|,|}}|$)"
            )
        return runs.filter(match)
    match = (
        Q(run_key__icontains=q)
        | Q(note__icontains=q)
        | Q(notes__icontains=q)
        | Q(tags__iregex=rf"(^|,){re.escape(q)}(,|$)")
    )
    if re.fullmatch(r"[0-9a-fA-F]{4,40}", q):
        match |= Q(git_sha__startswith=q.lower())
    return runs.filter(match)
