"""The image checks as a pytest module (test_image.py), run by xla_images.run.checking.checks.run against one image."""
