"""The same contract, pointing `kernel` at the full-tiles-only launch (must fail at M=1 and M=37)."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from rowscale_kernel import SHAPES, make_inputs, reference  # noqa: E402,F401
from rowscale_kernel import kernel_full_tiles as kernel  # noqa: E402,F401
