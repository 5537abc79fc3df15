"""Spatial and hybrid decomposition (Dryden et al.): geometry, costs and the layer planner."""
