"""Geo/intent router: the OpenAI front door that picks edge or center per request."""

from geo_router.app import RouterState, create_app
from geo_router.settings import RouterSettings

__all__ = ["RouterSettings", "RouterState", "create_app"]
