"""Matrix text several unit tests build their matrices from: written once, so a change of the release facts
(the 2.9.0 pins of matrix.yaml) is one edit."""
from __future__ import annotations

# The 2.9.0 release as matrix.yaml's `releases:` holds it (indented for that mapping); a test adds its own keys
# after it (torchvision, torchaudio) or other releases around it.
RELEASE_2_9_0 = """\
  "2.9.0":
    torch: "2.9.0"
    pytorch_git_rev: v2.9.1
    xla_git_rev: v2.9.0
    python_support: ">=3.10,<3.14"
    libtpu: "0.0.21"
"""
