"""Plug-ins for what one kind of host adds beyond the GPU model (measured, chosen by the bundle)."""
