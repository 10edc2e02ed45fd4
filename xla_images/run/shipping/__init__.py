"""Shipping images: push and published.json (publish, zstd_push), resolve, pull through a mirror
(mirror), promote, prune, sign; every registry call goes through run.registry.
"""
