"""Collectives on a topology: plans, rings, and their flow-level or analytic timing."""
