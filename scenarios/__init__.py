"""Scenario YAML files (quickstart, paper reproductions, sweeps) and their schema and loader."""
