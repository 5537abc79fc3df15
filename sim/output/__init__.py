"""What leaves a simulation: summaries, flat records and Perfetto traces."""
