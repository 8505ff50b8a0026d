"""The one base class of errors caused by the user's input, not by a bug in branchpoint.

`UserInputError` (a ``ValueError``) covers a malformed config, an unknown method or action, a missing or
corrupt file, mismatched tokenizers, an empty prompt set, features that do not match a selector's schema.
The CLI prints such an error as one line (exit status 2); every other exception is a bug and keeps its
traceback. Each layer subclasses it for its own inputs (``ConfigError``, ``ModelLoadError``,
``PromptSetError``, ``DatasetError``, ``FeatureError``, ...), so callers can also catch precisely.
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Bad input from the user; the message says what was wrong, where, and what to do."""
