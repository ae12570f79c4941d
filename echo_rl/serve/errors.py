"""The server's one error type: an OpenAI-style error body with its HTTP status.

Its own module so the app and the engine host (which turns engine faults into it) both import it
without importing each other.
"""


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class ClientGone(Exception):
    """The client closed its connection before its reply was ready (the request was aborted)."""
