"""Searches over simulations: the largest batch that fits, each layer's decomposition."""
