"""The paths of the host's status page on the loop's listener (``PAGE``: ``/`` and everything under ``/page/``).

Read by the guard (``reconciler.api.guard``: a page path is answered by the page's own session check, its body is
a form) and by the page's routes. Standard library only (no imports at all), so the guard can import it.
"""

ROOT = "/"
PREFIX = "/page/"
LOGIN = "/page/login"
LOGOUT = "/page/logout"
LIVE = "/page/live"
STATIC = "/page/static/"
PLAN = "/page/plan"
APPLY = "/page/apply"
SWITCH = "/page/switch"
RECLAIM = "/page/reclaim"
PROBE = "/page/probe"
FORM_TYPE = b"application/x-www-form-urlencoded"


def is_page_path(path: str) -> bool:
    """``/`` or a path under ``/page/``: the page's, behind its session cookie rather than a bearer token."""
    return path == ROOT or path.startswith(PREFIX)
