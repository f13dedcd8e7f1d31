"""The knowledge the bot keeps: kernel_store/ entries and lessons/, plain files reviewed like code.

    location.py  WHERE they are (decided once: --knowledge-path, $OPTBOT_KNOWLEDGE_PATH, the current
                 directory's repository holding kernel_store/, else $OPTBOT_HOME/knowledge)
    store.py     entry.yaml -> Entry           records.py  bench.json -> Bench (typed, byte-stable)
    lessons.py   lessons/<slug>.md -> Lesson   known.py    recorded verdicts that apply unchanged
    recall.py    what the optimize steps ask   learn.py    verdicts -> entries, histories, lessons
    prompt.py    the agent's view              check.py, bench.py   `store check`, `store bench`

The loaders parse into dataclasses and raise ConfigError (file, key, value, expectation) on
anything malformed. docs/store.md has the formats.
"""

# DESIGN decision 8: one vocabulary of opportunity kinds, shared by analyze, the store and lessons
# (defined once, with the Opportunity type; that module imports nothing heavy).
from bot.analyze.opportunity import KINDS as OPPORTUNITY_KINDS  # noqa: E402,F401
