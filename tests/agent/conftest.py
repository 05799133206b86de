import sys
from pathlib import Path

# tiny_hf lives with the weight-sync tests; tests/ for cpu_config.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "weight_sync"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
