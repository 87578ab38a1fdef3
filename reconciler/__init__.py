"""reconciler: makes a GPU serving host match a declarative manifest of recipes on GPU slots."""

__version__ = "0.1.0"
