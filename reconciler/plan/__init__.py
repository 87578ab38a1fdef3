"""The pure planning layer: observation values (``observed``), the plan's values and their JSON both ways
(``actions``), why a change cannot be made (``causes``: each blocker's cause with its advice), GPU claims (``claims``),
why an enter's slots are not free (``slot_problems``), an enter's knowable failures (``enter_checks``), the placing of
a round's enters (``enters``), the planner (``planner``), the container spec (``spec``), VRAM (``vram``) and the
approval fingerprint (``fingerprint``). This file holds only this docstring: import from the modules."""
