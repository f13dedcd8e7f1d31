"""The run machinery of `optbot optimize`: run state and typed results (state.py), the context the steps
share (context.py), what makes a run resumable (resume.py), and the orchestrator (orchestrator.py)."""
