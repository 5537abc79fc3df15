"""What a rank's work costs: workloads, per-layer costs, the roofline, analytic models."""
