"""Moved to gpuvet.specs.reference (bench and report read it too): this name stays the same module for
code written before the move."""

import sys

from ..specs import reference as moved

sys.modules[__name__] = moved
