"""The topology library: YAML presets, their schema, loader, generators and routing."""
