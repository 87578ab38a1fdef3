"""Observation: reads Docker, GPU telemetry and /proc + the shm dir into one ``Observed`` value. Read-only."""
