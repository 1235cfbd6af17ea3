"""``lifecycle serve``: a read-only web dashboard of the machines, their resources, one
resource's history, stuck effects and refused risky edges, each page also as JSON, and
``/metrics`` for Prometheus (needs the ``serve`` extra: ``pip install 'lifecycle-fsm[serve]'``).

| module | what it is |
|---|---|
| ``metrics`` | the Prometheus collector, probe calls counted, /metrics on a port of its own |
| ``app`` | the Starlette application and its pages (templates in ``templates/``) |

What the pages read is in :mod:`lifecycle.store.statements.dashboard`, over a database opened
read-only (:mod:`lifecycle.store.readonly`); a resource's history is told by
:mod:`lifecycle.story`, as ``lifecycle history`` tells it.
"""
