"""MLCommons Chakra's execution-trace schema, ``et_def.proto`` (MIT; see README.md and LICENSE here)."""
