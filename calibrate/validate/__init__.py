"""Predicted against measured: validation runs, their report, and the quickstart."""
