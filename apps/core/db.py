"""The one place that knows which database is in use, and database calls that must survive a dropped
connection.

Every branch on the database vendor lives here: the SQL that differs between Postgres and SQLite
(epoch arithmetic, CTE fences, advisory locks, COPY) is asked for by what it does, never by vendor.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import TypeVar

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import InterfaceError, OperationalError, connection, models
from django.db.models import FloatField, Func, QuerySet
from django.db.models.query import get_related_populators
from django.db.transaction import TransactionManagementError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def db_retry(fn: Callable[..., T], /, *, what: str, budget_s: float | None = None, **kwargs) -> T:
    """Call fn(**kwargs); on a lost or refused connection close it,
    back off and try again for up to budget_s.

    A connection kept since the task began (CONN_MAX_AGE) may have died with a database restart;
    Django only learns it on the next query. fn must be safe to repeat: the services it wraps are
    idempotent for the same owner (a claim or finish that committed before the answer was lost is
    seen as done).
    """
    budget = settings.COSTLAB_WORKER_DB_RETRY_S if budget_s is None else budget_s
    deadline = time.monotonic() + budget
    delay, tries = 0.25, 0
    while True:
        tries += 1
        try:
            return fn(**kwargs)
        except (OperationalError, InterfaceError) as exc:
            connection.close()  # a fresh connection next time, never the dead one
            left = deadline - time.monotonic()
            if left <= 0:
                logger.error(
                    "%s: database unreachable for %.0f s (%d tries), giving up: %s",
                    what,
                    budget,
                    tries,
                    exc,
                )
                raise
            logger.warning(
                "%s: database call failed (%s: %s); retrying in %.1f s (%.0f s left)",
                what,
                type(exc).__name__,
                str(exc).strip().splitlines()[0] if str(exc).strip() else "",
                min(delay, left),
                left,
            )
            time.sleep(min(delay, left))
            delay = min(delay * 2, 5.0)


def is_postgres() -> bool:
    """Postgres (COPY, advisory locks, a planner that inlines CTEs); otherwise SQLite,
    the embedded default."""
    return connection.vendor == "postgresql"


def copy_rows(cursor, target: str, rows: Iterable[tuple]) -> None:
    """COPY rows into ``target`` ("table (columns)"), Postgres only. COPY goes to psycopg's own
    cursor, past Django's wrapper: wrap_database_errors turns its errors into Django's
    (IntegrityError...)."""
    with connection.wrap_database_errors, cursor.copy(f"COPY {target} FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


class Compiled:
    """A queryset compiled to SQL once per process (and database), then run with other values.

    On a hot path the ORM's compile can cost more CPU than the query: the telemetry POST's
    locked read of its run (select_related, annotations) took 4.2 ms of CPU to compile and
    1.1 ms to run (AMD EPYC, 2 cores, bf16 emulated (slow)). `build(**values)` gives the
    queryset; each value must reach the SQL as one parameter (a pk, an id, a text key). Per set
    of names a call passes (a shape), it is built once with a marker per value and compiled;
    each call puts its values where the markers landed. The rows become instances as QuerySet
    iteration makes them (the same converters, select_related objects and annotations).
    """

    _MARK = -7_391_046_528_001  # a marker no caller's id equals

    def __init__(self, build: Callable[..., QuerySet]):
        self.build = build
        self._done: dict[tuple, tuple] = {}

    def _compiled(self, names: tuple[str, ...]) -> tuple:
        key = (connection.alias, connection.vendor, names)
        found = self._done.get(key)
        if found is None:
            marks = {name: self._MARK - i for i, name in enumerate(names)}
            queryset = self.build(**marks)
            compiler = queryset.query.get_compiler(using=queryset.db)
            sql, params = compiler.as_sql()
            slots = [
                (i, name)
                for i, p in enumerate(params)
                for name, mark in marks.items()
                if (type(p) is int and p == mark) or (type(p) is str and p == str(mark))
            ]
            if sorted(name for _, name in slots) != sorted(names):
                raise ImproperlyConfigured(
                    f"Compiled: each of {names} must reach the SQL as one parameter"
                )
            # What ModelIterable derives from the compiler's state, once.
            select, klass_info = compiler.select, compiler.klass_info
            fields = klass_info["select_fields"]
            span = slice(fields[0], fields[-1] + 1)
            attnames = [f[0].target.attname for f in select[span]]
            populators = get_related_populators(klass_info, select, connection.alias)
            found = self._done[key] = (
                compiler,
                sql,
                list(params),
                slots,
                bool(queryset.query.select_for_update),
                (klass_info["model"], span, attnames, populators),
            )
        return found

    def all(self, **values) -> list[models.Model]:
        compiler, sql, params, slots, for_update, rows_to = self._compiled(tuple(sorted(values)))
        if for_update and connection.get_autocommit():  # as the ORM refuses it
            raise TransactionManagementError(
                "select_for_update cannot be used outside of a transaction."
            )
        params = list(params)
        for i, name in slots:
            params[i] = values[name]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        # As django.db.models.query.ModelIterable makes instances of the rows.
        model, span, attnames, populators = rows_to
        out = []
        for row in compiler.results_iter([rows]):
            obj = model.from_db(connection.alias, attnames, row[span])
            for populator in populators:
                populator.populate(row, obj)
            for name, position in compiler.annotation_col_map.items():
                setattr(obj, name, row[position])
            out.append(obj)
        return out

    def get(self, **values) -> models.Model:
        """The one row, or the model's DoesNotExist."""
        found = self.all(**values)
        if not found:
            model = self._compiled(tuple(sorted(values)))[5][0]
            raise model.DoesNotExist(f"{model._meta.object_name} matching query does not exist.")
        return found[0]


_UPDATES: dict[tuple, tuple[list[models.Field], str]] = {}


def fields_save(obj: models.Model, names: list[str]) -> None:
    """``obj.save(update_fields=names)`` with its UPDATE's SQL made once per model and fields:
    each value prepared as save prepares it (auto_now set, get_db_prep_save), one UPDATE by pk.
    For a hot path's row (a telemetry batch's run totals: 2.0 ms of CPU through save, AMD EPYC,
    2 cores, bf16 emulated (slow)); sends no save signals."""
    model = type(obj)
    key = (model, tuple(names), connection.alias, connection.vendor)
    found = _UPDATES.get(key)
    if found is None:
        quote = connection.ops.quote_name
        fields = [model._meta.get_field(name) for name in names]
        sets = ", ".join(f"{quote(f.column)} = %s" for f in fields)
        pk = quote(model._meta.pk.column)
        found = _UPDATES[key] = (
            fields,
            f"UPDATE {quote(model._meta.db_table)} SET {sets} WHERE {pk} = %s",
        )
    fields, sql = found
    values = [f.get_db_prep_save(f.pre_save(obj, False), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, [*values, obj.pk])


# Fields whose Python value is what psycopg writes: no per-value preparation by Django.
_PLAIN_FIELDS = (
    models.IntegerField,
    models.FloatField,
    models.BooleanField,
    models.CharField,
    models.TextField,
    models.DateField,  # and DateTimeField
    models.ForeignKey,
)


def copy_instances(model: type[models.Model], objs: list[models.Model]) -> None:
    """Insert unsaved instances as bulk_create would, but through COPY on Postgres: for thousands
    of wide rows, Django's statement (a prepared value per field per row) costs more than the
    insert itself. The instances get no pk back. bulk_create elsewhere (SQLite)."""
    if not objs:
        return
    if not is_postgres():
        model.objects.bulk_create(objs)
        return
    fields = [f for f in model._meta.concrete_fields if not (f.primary_key and f.db_returning)]
    plain = [isinstance(f, _PLAIN_FIELDS) for f in fields]  # the others: Django prepares them
    decimal = [isinstance(f, models.DecimalField) for f in fields]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)

    def prepared(f: models.Field, v, is_plain: bool, is_decimal: bool):
        if is_plain or (is_decimal and type(v) is Decimal and v.is_finite()):
            # A finite Decimal is what Django would send (Postgres' adapt_decimalfield_value
            # passes it on); a float still goes through Django, which rounds it to max_digits.
            return v
        return f.get_db_prep_save(v, connection)

    def row(obj: models.Model) -> tuple:
        values = (f.pre_save(obj, True) for f in fields)  # auto_now and the like, as on save
        return tuple(map(prepared, fields, values, plain, decimal))

    with connection.cursor() as cursor:
        copy_rows(cursor, f"{model._meta.db_table} ({columns})", (row(o) for o in objs))


def epoch_ms_sql(column: str) -> str:
    """SQL for a timestamp column as ms since the epoch: charts need numbers, and parsing thousands
    of timestamps in Python costs more than the query."""
    if is_postgres():
        return f"(EXTRACT(EPOCH FROM {column}) * 1000)"
    return f"((julianday({column}) - 2440587.5) * 86400000.0)"  # SQLite stores UTC text


class EpochMs(Func):
    """A DateTimeField as ms since the epoch, computed by the database."""

    output_field = FloatField()

    def as_sql(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        return epoch_ms_sql(column), params


def cte_fenced(cte: str) -> str:
    """A FROM item that evaluates the CTE once, not per joined row: Postgres inlines a CTE unless an
    OFFSET fences it. SQLite has no such planner step, and refuses OFFSET without LIMIT."""
    return f"(SELECT * FROM {cte} OFFSET 0) {cte}" if is_postgres() else cte


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key per lock name (Python's hash() changes per process)."""
    return int.from_bytes(
        hashlib.sha256(f"costlab:{name}".encode()).digest()[:8], "big", signed=True
    )


def advisory_xact_lock_try(name: str) -> bool | None:
    """Take a transaction-scoped advisory lock: True, or False when another transaction holds it.

    None where the database has no advisory locks (SQLite): the caller locks a row instead.
    """
    if not is_postgres():
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [advisory_key(name)])
        return bool(cursor.fetchone()[0])
