"""Colour on the command line: ``Style`` paints text only on a terminal and without NO_COLOR; piped, text stays
plain. Used by every command that prints in colour (``Console.style``, the renderers of ``reconciler.cli.render``
and ``shm``); light, as the parser's modules load it.
"""

from __future__ import annotations

import os
import sys
from typing import TextIO

from reconciler.base.units import own


class Style:
    def __init__(self, stream: TextIO | None = None, *, color: bool | None = None):
        stream = stream or sys.stdout
        if color is None:
            color = stream.isatty() and not os.environ.get("NO_COLOR")
        self.color = color

    def _c(self, code: str, text: str) -> str:
        # Marked as the tool's own: the console writes these raw and escapes every other control character.
        return own("\x1b[" + code + "m") + text + own("\x1b[0m") if self.color else text

    def red(self, t: str) -> str:
        return self._c("31", t)

    def green(self, t: str) -> str:
        return self._c("32", t)

    def yellow(self, t: str) -> str:
        return self._c("33", t)

    def bold(self, t: str) -> str:
        return self._c("1", t)

    def dim(self, t: str) -> str:
        return self._c("2", t)
