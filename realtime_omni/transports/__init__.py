"""Thin I/O shells around the session core: bytes/frames/JSON ⇄ events, no conversation logic."""
