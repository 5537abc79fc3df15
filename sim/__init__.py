"""The SimPy model of multi-GPU training hardware. Never imports torch."""
