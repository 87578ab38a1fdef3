"""Tests of one part alone, in memory or over recorded answers: the planner's cases, the parsers of /proc, NVML and the engine's answers, the renderers. No engine, no process, no socket."""
