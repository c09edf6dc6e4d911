"""The service's one error type: an HTTP status and the OpenAI-style JSON body it is answered with.

Raised by request parsing (service/schema.py, service/tools_api.py, service/body.py) and by the
handlers; service/app.py turns it into the response.
"""

from __future__ import annotations

from edge_runtime.errors import RequestError


class ApiError(RequestError):
    """An HTTP error answered as {"error": {"message", "type", "code", "param"}}."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 type_: str = "invalid_request_error", headers: dict | None = None,
                 close_connection: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.type = type_
        self.headers = headers or {}
        self.close_connection = close_connection  # after the answer: the body was not all read

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code,
                          "param": self.param}}
