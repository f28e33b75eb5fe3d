import os
import sys
from pathlib import Path

# Tests import the package from the source tree even without `pip install -e .`.
sys.path.insert(0, str(Path(__file__).parent.parent / "src"))
os.environ.setdefault("NO_COLOR", "1")
