"""The apply layer: the only part of the tool that changes the host. A package docstring, not a facade: import each
name from its module.

``applier`` (the converge pass: ``Applier``), its steps ``enter``, ``ports``, ``leave``, ``drain`` on the ground of
``context``, the pass's ``groups``, ``results`` and ``errors``, the lanes' ``http_check``, the writes to the engine
(``engine_ops``), the one guarded removal of offload files (``shm_guard``, ``shm_results``, ``shm_unlink``),
the functional probes (``probes``) and the page-cache drop (``pagecache``).
"""
