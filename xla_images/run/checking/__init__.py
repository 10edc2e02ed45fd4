"""Checking images: the image checks (checks, image_checks/), `test` (image_tests), the smoke suite
(smoke_runner), SBOMs (sbom), the ABI of images (abi_images), linters (lint), nightly pins
(nightly_check), benchmarks of an image (bench).
"""
