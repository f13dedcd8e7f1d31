"""Template generator: the norm + elementwise and elementwise-chain opportunities written as one
Triton row kernel by fixed rules, no LLM (docs/generate.md, "Template generator").

  lift.py       one opportunity instance in the captured graph -> a small expression program
  emit.py       the program -> kernel module (Triton + wrapper + custom op + reference) and its test
  wire.py       the checked rewrite of the engine statements the ops came from (one, or a run)
  across.py     the same across a call: the norm in a method, its consumers in a helper it calls
  generator.py  generate_templates(): candidate commits and their store-entry files
"""
