"""Measurement and execution on real hardware (the only part of trainsim that imports torch)."""
