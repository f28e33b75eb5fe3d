"""gpuvet: find out what GPU machine you really rented, with evidence."""

__version__ = "0.1.0"
