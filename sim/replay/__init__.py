"""Kineto traces: import, dependency graph, replay and what-ifs."""
