import os
import sys
from pathlib import Path

# Tests import the package from the source tree even without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
os.environ.setdefault("NO_COLOR", "1")

# Runs made by the tests are stored in a throw-away history, never the user's.
import tempfile  # noqa: E402

os.environ["GPUVET_DB"] = os.path.join(tempfile.mkdtemp(prefix="gpuvet-test-"), "runs.sqlite3")
