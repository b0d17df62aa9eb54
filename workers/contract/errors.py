"""The one base for what a user got wrong: a file, a path, a form or command value, a config.

The web pages, the API and the commands turn an InputError into its message (a 4xx, a form error,
a command error) in one place each; any other exception is a bug, shown as a 500 and logged.
Every message names the thing at fault and, where it can, what to do instead."""
from __future__ import annotations


class InputError(ValueError):
    """Something a user gave cannot be used; str(error) says what, where and what to do."""


class StopRequested(Exception):
    """A stage's should_stop() callback asked it to end (a user cancelled the run): not a failure."""
