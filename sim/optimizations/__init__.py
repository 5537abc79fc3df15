"""The data-movement optimizations of TECHNIQUES.md: preload, offload, compression, max-batch."""
