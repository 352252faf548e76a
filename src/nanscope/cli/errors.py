"""The error a subcommand raises to stop with a one-line message (no traceback)."""


class CommandError(Exception):
    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
