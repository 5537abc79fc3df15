"""Parallel strategies: the iteration each one runs on the machine, and their registry.

`base` holds the registry and the pieces every iteration is made of (`Context`); each other module registers
one or two strategies when imported. `base.get_strategy` imports the module of the strategy asked for, and
`base.strategies` all of them, so a run pays only for the strategy it uses.
"""
