"""The kernel test contract for rowscale_kernel.kernel (passes every shape)."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from rowscale_kernel import NAME, SHAPES, kernel, make_inputs, reference  # noqa: E402,F401
