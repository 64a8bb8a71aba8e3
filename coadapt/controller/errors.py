"""The controller's one exception root, and its HTTP status (mapped in exactly one place).

    ControllerError                 500  (never raised for user input)
     ├── SpecError                  422  a job spec or request body is invalid
     ├── AuthError                  401  missing or unknown token
     ├── ForbiddenError             403  a tenant token used for an admin operation
     ├── NotFoundError              404  no such job (or not yours: same answer, no leak)
     ├── ConflictError              409  e.g. a tenant name already taken
     ├── InvalidTransitionError     409  the job state machine refuses the change
     ├── PayloadTooLargeError       413  a request body over the API's size limit
     └── StorageError               503  the database cannot be reached

Each class carries its ``status``; :func:`coadapt.controller.api.create_app` installs one
handler for the root, and the CLI maps the same statuses to exit codes.
"""

from __future__ import annotations

from typing import Any


class ControllerError(Exception):
    """Root of every error the controller raises on purpose."""

    status: int = 500
    code: str = "internal"

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.details:
            body["details"] = self.details
        return body


class SpecError(ControllerError):
    """A job spec or a request body failed validation; ``details`` name each field."""

    status = 422
    code = "invalid_spec"


class AuthError(ControllerError):
    status = 401
    code = "unauthorized"


class ForbiddenError(ControllerError):
    status = 403
    code = "forbidden"


class NotFoundError(ControllerError):
    status = 404
    code = "not_found"


class ConflictError(ControllerError):
    status = 409
    code = "conflict"


class InvalidTransitionError(ConflictError):
    """A job state change the state machine does not allow (e.g. cancelling a finished job)."""

    code = "invalid_transition"


class PayloadTooLargeError(ControllerError):
    """A request body over the API's limit; the message names the limit and how to fit it."""

    status = 413
    code = "payload_too_large"


class StorageError(ControllerError):
    status = 503
    code = "storage_unavailable"
