"""central package."""
