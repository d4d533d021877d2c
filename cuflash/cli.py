"""The ``cuflash`` console command: the experiments and the report from one entry point.

usage: cuflash {sweep,report,run,info,help} [args]   (cuflash --version: the package version)

    cuflash sweep  [args]   attention tile sweep (experiments/tile_sweep.py): the main job
    cuflash report [args]   Markdown report from experiments/results (experiments/report.py)
    cuflash run NAME [args] any experiment script experiments/NAME.py (``cuflash run`` lists them)
    cuflash info            GPU, CuPy, NVRTC and the compile cache key
    cuflash help            this text (each command takes --help)

The experiment scripts live in the checkout's ``experiments/`` folder (an editable install, as README
does it); they use the public API only.
"""
from __future__ import annotations

import importlib.util
import sys

from .bench import ROOT

COMMANDS = {"sweep": "tile_sweep", "report": "report"}


def scripts() -> list[str]:
    """Names of the experiment scripts in the checkout (what ``cuflash run NAME`` accepts)."""
    folder = ROOT / "experiments"
    return sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")) if folder.is_dir() else []


def _list_scripts(file=None) -> None:
    file = file or sys.stdout
    names = scripts()
    if names:
        print("experiment scripts (cuflash run NAME [--help]):\n  " + "\n  ".join(names), file=file)
    else:
        print(f"cuflash: no experiments/ folder next to the package ({ROOT}); run from a source checkout "
              "(pip install -e .)", file=file)


def _run_script(name: str, argv: list[str], prog: str | None = None) -> int:
    """Run experiments/<name>.py's main with ``argv``; ``prog``: the command line it was called by (its usage
    line says ``cuflash run NAME`` or ``cuflash COMMAND`` instead of the script's file name)."""
    path = ROOT / "experiments" / f"{name}.py"
    if not path.is_file():
        print(f"cuflash: no experiment script {name!r}", file=sys.stderr)
        _list_scripts(sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location(f"cuflash_experiment_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # importable by name: a script's worker processes unpickle its functions
    saved = sys.argv
    sys.argv = [prog or f"cuflash run {name}"] + argv  # argparse's prog (the scripts find files by __file__)
    try:
        spec.loader.exec_module(mod)
        rc = mod.main(argv) if hasattr(mod, "main") else 0
    finally:
        sys.argv = saved
    # the exit status: an int (not a bool) as main returned it; None or anything else (a list of rows) is 0
    return rc if isinstance(rc, int) and not isinstance(rc, bool) else 0


def info() -> int:
    from . import _compile, bench

    env = bench.environment()
    for k, v in env.items():
        print(f"{k:>20}: {v}")
    print(f"{'cuda_src hash':>20}: {_compile.source_hash()}")
    print(f"{'CUDA headers':>20}: {_compile.cuda_include_dir()}")
    try:
        from cupy_backends.cuda.libs import nvrtc

        print(f"{'NVRTC':>20}: {nvrtc.getVersion()}")
    except Exception as e:
        print(f"{'NVRTC':>20}: not found ({e})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__

        print(f"cuflash {__version__}")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "info":
        if rest:  # --help or anything else: say what it does instead of running it
            asked = rest[0] in ("-h", "--help")
            print("usage: cuflash info\n\nPrints the GPU, driver, CuPy, NVRTC, the CUDA headers and the cuda_src "
                  "hash (the compile cache key).", file=sys.stdout if asked else sys.stderr)
            return 0 if asked else 2
        return info()
    if cmd == "run":
        if not rest or rest[0] in ("-h", "--help", "--list"):
            _list_scripts()
            return 0
        return _run_script(rest[0], rest[1:])
    if cmd in COMMANDS:
        return _run_script(COMMANDS[cmd], rest, f"cuflash {cmd}")
    print(f"cuflash: unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
