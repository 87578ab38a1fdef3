"""The handlers of the command line's commands, one module per command or family of commands, each importing at its
top what its commands use. The parser (``reconciler.cli`` and the modules that register commands beside it) names
each handler with a ``reconciler.cli.common.Command``, which imports its module only when the command runs: so
``--help``, a mistyped command and a command a running loop answers load none of them, and each command loads what
it uses and nothing of the others (docs/performance.md).
"""
