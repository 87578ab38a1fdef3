"""A deterministic simulation of a GPU serving host (docs/design.md, "The simulation").

``world.World`` holds a simulated engine, NVML, /proc and tmpfs on a virtual clock, all from one seed;
``seams.installed`` puts it under the project's real loader, planner, apply layer and loop by replacing only the
outermost I/O seams; ``machine.HostMachine`` drives it with hypothesis's stateful testing and checks the invariants
after every step. ``tests/sim/test_sim.py`` runs a fixed budget in CI, ``tests/sim/soak.py`` (``make soak``) a long one.
"""
