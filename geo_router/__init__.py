"""geo_router package."""
