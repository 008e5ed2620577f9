"""Errors of the endpoint registry; each message names the endpoint, request or field at fault."""

from __future__ import annotations


class RegistryError(ValueError):
    """Bad registry input (unknown role, bad number); the message names the field."""


class UnknownEndpointError(KeyError):
    def __str__(self) -> str:
        return f"unknown endpoint {self.args[0]!r}"


class UnknownRequestError(KeyError):
    def __str__(self) -> str:
        return f"unknown request {self.args[0]!r} (never dispatched, already completed, or expired)"


class DuplicateRequestError(ValueError):
    """A request id is already in flight."""
