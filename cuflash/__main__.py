"""``python -m cuflash ...``: the ``cuflash`` console command (cuflash.cli)."""
from .cli import main

raise SystemExit(main())
