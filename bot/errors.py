"""User-facing errors.

An OptbotError carries a message that is safe to show a user as-is (it names the file, key and
value at fault). The CLI prints it without a traceback and exits with code 2.
"""


class OptbotError(Exception):
    exit_code = 2


class ConfigError(OptbotError):
    """A workload or store file is malformed: the message names file, key, value, expectation."""

    def __init__(self, file, key: str, value, expected: str):
        self.file, self.key, self.value, self.expected = str(file), key, value, expected
        super().__init__(f"{self.file}: key '{key}': got {value!r}; expected {expected}")


class EngineError(OptbotError):
    """The engine repository or ref cannot be had."""


class RunnerError(OptbotError):
    """A runner job failed in a way the user must see (crash, timeout, bad result)."""
