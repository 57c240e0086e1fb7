"""model_sync package."""
