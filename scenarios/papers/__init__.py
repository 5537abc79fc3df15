"""Reproductions of the seed papers' claims."""
