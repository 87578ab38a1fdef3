"""The host's boundary: what the tool reads of the host and does to it through interfaces that a real host, Podman's
or Docker's engine, and the simulation each implement. Today it holds the container engine (``reconciler.host.engine``);
the other seams the apply layer gathers (``reconciler.apply.host_io.HostIO``) stay beside their readers
(docs/design.md, "The host's boundary: one engine protocol")."""
