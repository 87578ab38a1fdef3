"""The container engine behind one interface (``protocol.Engine``): Docker's (``docker``), Podman's (``podman``), the
standard-library reader both speak (``http``), and which of them a URL reaches (``connect``).

Read by the observers (``reconciler.observe.containers``) and written through by the apply layer
(``reconciler.apply.engine_ops``); the simulation (tests/sim) implements the same protocol, and one conformance
suite (tests/real/test_engine_conformance.py) holds every implementation to it. Importing this package costs the
standard library only: the Docker SDK is imported by the first write (docs/performance.md, start-up).
"""
