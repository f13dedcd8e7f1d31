"""module_pattern: the one rule that groups repeated blocks of a module path.

Imports nothing but `re`, so the bot (which must not import torch) and the runner's profiler both
use this one definition: a profile's kernel rows and the analyzer's opportunities then group the
same way.
"""
from __future__ import annotations

import re


def module_pattern(path: str) -> str:
    """transformer_blocks.3.attn.to_q -> transformer_blocks.*.attn.to_q (groups repeated blocks)."""
    return re.sub(r"\.\d+(?=\.|$)", ".*", path)
