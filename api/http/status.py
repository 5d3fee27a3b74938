"""HTTP statuses of ovq's own that the standard library does not name."""
from __future__ import annotations

CLIENT_CLOSED = 499  # nginx's "client closed request": nobody reads it, but logs and metrics do
