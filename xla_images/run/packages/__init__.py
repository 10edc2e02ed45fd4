"""The Python packages an image installs: locks made and checked (lock), the package index (index),
every lock's layer layout (layout), upstream releases for `update` (upstream).
"""
