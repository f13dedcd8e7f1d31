"""The knowledge the bot keeps in the repo: kernel_store/ entries (store.py) and lessons/ (lessons.py).

Both are plain files reviewed like code; the loaders here parse them into dataclasses and raise
ConfigError (file, field, value, expectation) on anything malformed.
"""

# DESIGN decision 8: one vocabulary of opportunity kinds, shared by analyze, the store and lessons.
OPPORTUNITY_KINDS = (
    "merge-siblings", "fuse-norm-consumer", "absorb-bias", "cfg-invariant-cache", "hoist-constant",
    "fuse-elementwise-chain", "attention-waste", "launch-bound",
)
