"""The one exception type whose message is shown to users as a single line."""


class UserError(ValueError):
    """Bad input or configuration that the user can fix; the message names what and how.

    The command line prints the message alone (no traceback unless ``--verbose``).
    Messages start with the file, variable or config key at fault and end with the fix.
    """
