"""Argument checks shared by the Peer's methods."""
from typing import Any


def rank_arg(value: Any, what: str) -> int:
    """``value`` when it is an int (bool is not one here); TypeError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    return value
