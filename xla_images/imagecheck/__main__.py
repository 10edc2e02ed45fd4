"""`python -m xla_images.imagecheck ...`, and the zipapp's entry point (`xla-images-check`)."""
import sys

from xla_images.imagecheck.cli import main

sys.exit(main())
