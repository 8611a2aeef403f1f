"""`rlbus ui`: a local web app over the store's read path (docs/architecture.md: Analytics)."""

from rlbus.ui.app import create_app
from rlbus.ui.server import serve

__all__ = ["create_app", "serve"]
