"""The data-movement optimizations of docs/techniques.md: preload, offload, compression, max-batch."""
