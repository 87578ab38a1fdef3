"""The pure planning layer: observation values, the planner, GPU claims, the container spec, VRAM, the approval fingerprint."""
