"""Adapters that plug realtime_omni into other frameworks (each imports its framework lazily)."""
