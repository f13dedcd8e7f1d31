"""Model-level analysis: detectors over the captured step graph and the profile -> ranked
Opportunities (docs/analyze.md)."""
