"""Measuring a box: topology, links, collectives, per-layer compute, into a bundle."""
