"""Case 2a: the same persisted transition with django-fsm-2 and django-fsm-log.

Django runs standalone in this process (``settings.configure``), on a SQLite file opened as
lifecycle opens its own: WAL, synchronous=NORMAL, foreign keys on (Django's default), a busy
timeout and ``BEGIN IMMEDIATE``. The model is defined here, in the app of ``django_app``; the
library apps' tables come from ``migrate``, the model's from the schema editor.

One operation is what a careful user writes: in one ``transaction.atomic()``, read the row,
call the transition (django-fsm-log's signal handler writes the StateLog row), save with
``ConcurrentTransitionMixin``'s conditional UPDATE (django-fsm's optimistic locking).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import toggle
from .harness import Bench, BenchError, Case

APP = "benchmarks.django_app"
APP_LABEL = "lifecycle_bench"  # django_app.APP_LABEL, without importing Django before it is needed

_configured: Path | None = None
_model: Any = None


def _setup(path: Path) -> Any:
    """Configure Django once per process (settings cannot be configured twice); returns the
    model class."""
    global _configured, _model
    if _configured is not None:
        if _configured != path:
            raise RuntimeError(f"Django is already configured for {_configured}")
        return _model
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False,  # DEBUG would keep every query in memory
        USE_TZ=True,
        TIME_ZONE="UTC",
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_fsm_log",
            f"{APP}.BenchConfig",
        ],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": str(path),
                "OPTIONS": {
                    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL",
                    "transaction_mode": "IMMEDIATE",
                    "timeout": 30,
                },
            }
        },
        LOGGING_CONFIG=None,
    )
    django.setup()
    _model = _define_model()
    _configured = path
    return _model


def _define_model() -> Any:
    from django.db import models
    from django_fsm import ConcurrentTransitionMixin, FSMField, transition

    class Toggle(ConcurrentTransitionMixin, models.Model):  # type: ignore[misc]
        key = models.CharField(max_length=255, unique=True)
        state = FSMField(default="a")
        data = models.JSONField(default=dict)
        updated_at = models.DateTimeField(auto_now=True)

        class Meta:
            app_label = APP_LABEL

        @transition(field=state, source="a", target="b")
        @transition(field=state, source="b", target="a")
        def flip(self) -> None:
            pass

    return Toggle


@contextmanager
def django_fsm_fire(path: Path) -> Iterator[Bench]:
    model = _setup(path)
    from django.core.management import call_command
    from django.db import connection, transaction
    from django_fsm_log.models import StateLog

    call_command("migrate", verbosity=0, interactive=False)
    with connection.schema_editor() as editor:
        editor.create_model(model)
    model.objects.create(key=toggle.KEY)
    get, atomic, key = model.objects.get, transaction.atomic, toggle.KEY

    def op() -> None:
        with atomic():
            obj = get(key=key)
            before = obj.state
            obj.flip()
            obj.save()
        if obj.state == before:
            raise BenchError("django-fsm: flip did not move the state")

    def verify(n: int) -> None:
        logs = StateLog.objects.count()
        state = model.objects.get(key=key).state
        if logs != n or state != ("a" if n % 2 == 0 else "b"):
            raise BenchError(f"django-fsm: after {n} flips expected {n} StateLog rows, found "
                             f"{logs} (state {state})")

    try:
        yield Bench(op, verify)
    finally:
        connection.close()


DJANGO = Case("sqlite.django_fsm", "django-fsm-2 + django-fsm-log",
              lambda ws: django_fsm_fire(ws.sqlite_path("django")))

