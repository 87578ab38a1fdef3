"""The API's two errors: ``ApiSetupError`` (it cannot be served as asked: a token unusable, an address exposed
without the flag, a listener that did not start) and ``_BadRequest`` (a request that the guard or a route answers
with 400, saying which field and why). Raised by the package's modules.
"""

from __future__ import annotations

from reconciler.base.errors import ReconcilerError


class ApiSetupError(ReconcilerError):
    """The API cannot be served as asked: a token file that is unusable, a remote address without the flag."""

    code = "api_setup"


class _BadRequest(Exception):
    pass
