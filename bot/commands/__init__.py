"""One module per CLI command; shared options in common.py."""
