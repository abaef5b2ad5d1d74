"""The suite's shared set-up: the helpers in tests/support/ import by name from every folder.

Tests are grouped by concept (core, sim, testing, socket, torch, launch, visualize, app, project);
``python3 -m pytest tests/sim`` runs one folder. tests/programs/ holds whole programs that tests launch.
"""

import sys
from pathlib import Path

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)
