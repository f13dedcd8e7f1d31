"""Generators: each turns an Opportunity into Candidates (one engine commit each, in its own
worktree). Store replay lives in replay.py; the shared Candidate type in candidate.py."""
