"""Side-by-side benchmarks of lifecycle, run by ``make bench`` (``python -m benchmarks``).

Every number in the table is measured in the same run, on the same machine, so the ratios
compare like with like:

1. a persisted fire through :class:`lifecycle.Engine` against the floor: the same
   statements through the raw driver (``sqlite3`` on a WAL file, ``psycopg`` on PostgreSQL);
2. the same persisted transition with what a user would pick instead: django-fsm-2 with
   django-fsm-log, and sqlalchemy-fsm with a hand-written log row;
3. the in-memory decision alone against a bare ``transitions.Machine`` and
   python-statemachine;
4. effects drained from the outbox on PostgreSQL by 1, 2 and 4 ``Worker`` processes against
   the floor: the same claim-run-mark statements through raw psycopg in as many processes;

and, among the later sections, 13: no-op jobs drained by lifecycle's ``Worker`` against the
PostgreSQL job queues pgqueuer and procrastinate, each in a fresh database of its own
(``benchmarks.queues``); 14: PostgreSQL through a latency-injecting proxy
(``benchmarks.netproxy``), a fire against the raw 5-statement floor and create, observe and
``observe_many`` at 0, 0.25 and 1 ms per round trip, with the round trips each operation takes
(``benchmarks.network``).

``python -m benchmarks --help`` lists the options (``--quick`` for a smoke run of a few
seconds, ``--json`` for machines, ``--profile CASE`` for a cProfile breakdown).
"""
