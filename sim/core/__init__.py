"""The machine model: devices, links and flows, memory, call latency, and a run's result."""
