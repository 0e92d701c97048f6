"""nanoplan's command line: a thin skin that imports the planner and, for the commands that
train or trace, the runner. `nanoplan.cli:main` is the entry point."""

from planner import __version__

__all__ = ["__version__"]
