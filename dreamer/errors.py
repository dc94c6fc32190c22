"""The one exception type a user can cause: printed as a single line, no traceback."""


class UserError(Exception):
    """Bad input (config, env name, run directory, missing extra).

    The message must say what to change. ``python -m dreamer`` prints it as one
    line and exits with status 2 (set ``HYDRA_FULL_ERROR=1`` for a traceback).
    """
