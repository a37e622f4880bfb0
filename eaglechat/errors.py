"""Errors a user can cause. The CLI prints them as one line and exits non-zero (no traceback)."""


class EaglechatError(Exception):
    """Base class: the message is the one line the user sees."""

    exit_code = 1


class UsageError(EaglechatError):
    exit_code = 2


class ModelNotFound(EaglechatError):
    """Unknown alias, missing folder, not pulled."""


class WeightsError(EaglechatError):
    """Missing, corrupt or mismatched weight files (including a head for another base)."""


class ContextTooLong(EaglechatError):
    """The prompt (plus at least one new token) does not fit the context window."""


class OutOfMemory(EaglechatError):
    exit_code = 3


class HubError(EaglechatError):
    """Offline, gated, not found, interrupted download."""


class RemoteError(EaglechatError):
    """An OpenAI-compatible server is unreachable, refused the key, lacks the model or failed."""


class Interrupted(EaglechatError):
    exit_code = 130


class UnsupportedModel(EaglechatError):
    """An architecture eaglechat cannot decode exactly yet: refused in one line, never run approximately."""
