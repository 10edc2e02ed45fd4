"""`xla-images-check`: does an image built FROM ours still hold the flavour it was? Runs inside the image.

Four questions:

* are torch, torch_xla and libtpu still the versions the image's constraints file pins (the lock's), PEP 440
  equal, each installed once?
* is every installed distribution's Requires-Dist satisfied (`pip check`'s question)?
* does every native module of the venv import, `import torch` first, in a fresh python of the venv?
* does torch use the ABI the image names (XLA_IMAGES_ABI)?

Site-packages is data to the checker: it reads metadata in bounded pieces and runs no `.pth` and no package code
in its own process (the zipapp's shebang is `python -IS`). The imports run in children of the venv's python, where
running package code is the point; the static ABI reader (`xla_images.abi`) only explains a failed import. It
imports only the standard library, `xla_images.errors` and `xla_images.abi`, so the image carries it as one
executable zipapp (run.building.check_tool writes it). Exit 0 holds, 1 problems (each named), 2 the image or its
inputs cannot be read (one line).
"""
from .check import CheckResult, Problem, check_image, read_pins

__all__ = ["CheckResult", "Problem", "check_image", "read_pins"]
