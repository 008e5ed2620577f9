"""The one strict pydantic base: configuration and API models refuse fields they do not know.

A misspelt key in a YAML file or a request body is an error naming the key, never a
silently ignored setting. Models that need more (strict types, no inf/nan, aliases)
add those keys to their own `model_config`; pydantic merges them with this one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

# What pydantic puts before the message of a ValueError or assert raised in a validator.
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


def error_message(err: dict) -> str:
    """One pydantic error's message as our validator wrote it (pydantic's "Value error, " prefix taken off)."""
    msg = str(err["msg"])
    for prefix in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(prefix)
    return msg
