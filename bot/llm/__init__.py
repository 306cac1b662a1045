"""Model providers."""
