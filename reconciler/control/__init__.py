"""The running loop answers the command line: a local socket, ``reconciler-HOST.sock`` in the runtime directory.

While ``reconciler run`` runs for a host, ``plan``, ``status``, ``audit``, ``probe``, ``shm status`` and the
commands that change the host (``apply``, ``apply FILE``, ``adopt``, ``shm reclaim``) are carried out by it: the
command line (``reconciler.cli.main``) hands its arguments over with ``submit`` (``client``) before it imports
anything of the model, and the loop (``server``) runs the very command, ``reconciler.cli.common.run_command``, in a
thread of its own, computed fresh from the files and the host at that moment, its output streamed back as it is
written, so both ways print the same bytes. A command that changes the host holds the loop's pass lock instead of
the host lock file the loop holds, so it waits for a pass to end rather than being refused; an apply shows the plan
the loop computed, asks on the client's terminal while the loop's passes go on, and runs that plan only if nothing
changed meanwhile (else it is refused as stale, with what changed). The client's Ctrl-C stops an apply at a safe
point, as it would stand-alone.

Only root (the user the loop runs as) reaches the socket: it lives in the runtime directory, which both ends
check like sshd's StrictModes (``reconciler.base.fsafe``), the socket file must be the loop user's and 0600, and
each end checks the other's credentials on the connection (``SO_PEERCRED``). A planted directory or socket is
refused with what is wrong and the fix. Without a loop (no socket, or nothing listening) every command runs
stand-alone, as it does with ``RECONCILER_NO_LOOP=1``; a loop of another root, state directory or version answers
"not mine" and the command runs stand-alone too.

This file holds only this docstring. The modules: ``protocol`` (the frame format, its limits and deadlines, both
ends), ``client`` (the command line's end), ``server`` (the loop's end, running commands through the runner it is
handed).
"""
