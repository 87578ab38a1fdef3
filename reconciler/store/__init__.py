"""What the tool keeps on disk about a host: install state, the host lock and the loop's published state, history,
probe runs, audit. This module holds only this docstring: each part is imported from its own module."""
