"""`xla-images-check`: does an image built FROM ours still hold the flavour it was? Runs inside the image.

Three questions, each answered from files (nothing of torch is imported):

* are torch, torch_xla and libtpu still the versions the image's constraints file pins (the lock's)?
* is `pip check` clean?
* would every extension of the venv that links torch load (the `xla_images.abi` check of the whole venv)?

It imports only the standard library, `xla_images.errors` and `xla_images.abi`, so the image carries it as one
executable zipapp holding this package and the abi package (run.building.check_tool writes it; the same abi code the build
and `build.py abi check` run, not a copy of its logic). Exit 0 fine, 1 a problem (each named), 2 bad input (facts
or venv missing, an unreadable file: one line).
"""
from .check import CheckResult, Problem, check_image, read_pins

__all__ = ["CheckResult", "Problem", "check_image", "read_pins"]
