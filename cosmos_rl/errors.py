class UserError(Exception):
    """A problem the user caused and can fix; the CLI prints it without a traceback."""
