"""Parallel strategies: the iteration each one runs on the machine, and their registry.

`registry` holds the `Strategy` protocol and the registry; `context` the `Context` every strategy's
processes run against (with `settings`, `plugins` and `loaders`, its typed parts); each other module
registers one or two strategies when imported. `registry.get_strategy` imports the module of the strategy
asked for, and `registry.strategies` all of them, so a run pays only for the strategy it uses.
"""
