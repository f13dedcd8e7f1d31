"""The `/optimize` comment trigger (`optbot comment`, issue 15): the event payload, the comment's
grammar, who may trigger, and the typed request the workflow hands to `optbot optimize`."""
