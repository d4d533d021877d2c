"""Shared by the tests of the experiment scripts: load experiments/NAME.py as a fresh module (its module-level
settings start from scratch in each test; a script imports experiments/_common.py itself)."""
import importlib.util
from pathlib import Path

EXP = Path(__file__).resolve().parent.parent / "experiments"


def load_script(name, tag="test"):
    """experiments/<name>.py as a new module object named _cuflash_<tag>_<name>."""
    spec = importlib.util.spec_from_file_location(f"_cuflash_{tag}_{name}", EXP / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
