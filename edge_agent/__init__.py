"""edge_agent package."""
