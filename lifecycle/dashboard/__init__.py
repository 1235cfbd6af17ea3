"""``lifecycle serve``: a read-only web dashboard of the machines, their resources, one
resource's history, stuck effects and refused risky edges, each page also as JSON, and
``/metrics`` for Prometheus (needs the ``serve`` extra: ``pip install 'lifecycle-fsm[serve]'``).

| module | what it is |
|---|---|
| ``database`` | the database opened read-only; :class:`Unavailable` for one with nothing to show |
| ``reads`` | the statements of the pages and of /metrics |
| ``metrics`` | the Prometheus collector, probe calls counted, /metrics on a port of its own |
| ``app`` | the Starlette application and its pages (templates in ``templates/``) |
"""
