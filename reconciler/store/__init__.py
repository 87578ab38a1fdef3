"""What the tool keeps on disk about a host: install state, the host lock and loop state, history, probe runs, audit."""
