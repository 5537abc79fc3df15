"""Executing training runs for real with PyTorch, as a scenario describes them."""
