"""Case 2b: the same persisted transition with sqlalchemy-fsm.

sqlalchemy-fsm moves the state in memory; the user commits it. One operation is what a
careful user writes: in one session and transaction, read the row, ``flip.set()``, add a
hand-written log row, commit. The mapper's ``version_id_col`` gives the optimistic lock
(``UPDATE ... WHERE id = ? AND version = ?``). The SQLite file is opened as lifecycle opens
its own: WAL, synchronous=NORMAL, foreign keys on, a busy timeout, ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, func, select

from . import toggle
from .harness import Bench, BenchError, Case

UTC = dt.UTC


def _models() -> tuple[Any, Any, Any]:
    from sqlalchemy import JSON, Column, DateTime, ForeignKey, Integer, String
    from sqlalchemy.orm import DeclarativeBase
    from sqlalchemy_fsm import FSMField, transition

    class Base(DeclarativeBase):
        pass

    class Toggle(Base):
        __tablename__ = "toggle"
        id = Column(Integer, primary_key=True)
        key = Column(String(255), nullable=False, unique=True)
        state = Column(FSMField(200), nullable=False, default="a")
        version = Column(Integer, nullable=False)
        data = Column(JSON, nullable=False, default=dict)
        updated_at = Column(DateTime(timezone=True), nullable=False)
        __mapper_args__ = {"version_id_col": version}  # noqa: RUF012

        @transition(source=["a", "b"])
        class flip:  # a transition is named like the method it replaces
            @transition(source="a", target="b")
            def from_a(self, instance: Any) -> None:
                pass

            @transition(source="b", target="a")
            def from_b(self, instance: Any) -> None:
                pass

    class ToggleLog(Base):
        __tablename__ = "toggle_log"
        id = Column(Integer, primary_key=True)
        toggle_id = Column(ForeignKey("toggle.id"), nullable=False)
        trigger = Column(String(200), nullable=False)
        source = Column(String(200), nullable=False)
        dest = Column(String(200), nullable=False)
        at = Column(DateTime(timezone=True), nullable=False)

    return Base, Toggle, ToggleLog


@contextmanager
def sqlalchemy_fsm_fire(path: Path) -> Iterator[Bench]:
    from sqlalchemy.orm import sessionmaker

    base, model, log = _models()
    engine = create_engine(f"sqlite:///{path}")

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy's recipe: we say BEGIN ourselves
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                       "busy_timeout=30000"):
            dbapi_connection.execute(f"PRAGMA {pragma}")

    @event.listens_for(engine, "begin")
    def _begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    base.metadata.create_all(engine)
    session_factory = sessionmaker(engine)
    with session_factory.begin() as session:
        session.add(model(key=toggle.KEY, state="a", updated_at=dt.datetime.now(UTC)))
    query = select(model).where(model.key == toggle.KEY)
    trigger = toggle.TRIGGER

    def op() -> None:
        with session_factory.begin() as session:
            obj = session.scalars(query).one()
            source = obj.state
            obj.flip.set()
            dest = obj.state
            if dest == source:
                raise BenchError("sqlalchemy-fsm: flip did not move the state")
            now = dt.datetime.now(UTC)
            obj.updated_at = now
            session.add(log(toggle_id=obj.id, trigger=trigger, source=source, dest=dest, at=now))

    def verify(n: int) -> None:
        with session_factory() as session:
            logs = session.scalar(select(func.count()).select_from(log))
            obj = session.scalars(query).one()
        if logs != n or obj.version != n + 1:
            raise BenchError(f"sqlalchemy-fsm: after {n} flips expected {n} log rows and "
                             f"version {n + 1}, found {logs} and {obj.version}")

    try:
        yield Bench(op, verify)
    finally:
        engine.dispose()


SQLALCHEMY_FSM = Case("sqlite.sqlalchemy_fsm", "sqlalchemy-fsm + log row",
                      lambda ws: sqlalchemy_fsm_fire(ws.sqlite_path("sqlalchemy_fsm")))
