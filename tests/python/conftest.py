"""pytest setup: the package from python/ of this checkout, the library of build/release (or
ARGUS_LIBRARY), and ../shared beside the checkout."""
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples" / "python"))

SHARED = ROOT.parent / "shared"
STORIES = SHARED / "models" / "stories260K.gguf"
ARGUS_CLI = Path(os.environ.get("ARGUS_CLI", ROOT / "build" / "release" / "argus"))


@pytest.fixture
def stories():
    if not STORIES.exists():
        if os.environ.get("ARGUS_REQUIRE_SHARED"):
            pytest.fail(f"{STORIES} is missing and ARGUS_REQUIRE_SHARED is set")
        pytest.skip(f"{STORIES} is absent")
    return STORIES
