"""The one error type a user can cause: the CLI prints its message and exits 2, no traceback."""


class UserError(Exception):
    """A problem the user can fix; the message is one sentence naming what to change."""

    exit_code = 2
