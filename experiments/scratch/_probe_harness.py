"""Shared pieces of the new-user probes (newuser_probe.py, newuser_attn_probe.py, newuser_amp_probe.py): the
step outcomes and how an unexpected exception is reported. Each probe keeps its own Check class (its steps record
skips and deadlines differently)."""
import traceback


class Fail(Exception):
    """A step's expectation not met (its message says what was expected and what came back)."""


class Skip(Exception):
    """A step or check that does not apply here (e.g. torch missing)."""


def exc_text(e, script):
    """``Type: message (at file:line <- ...)``: the message on one line (at most 400 characters) and the innermost
    three frames of ``script`` (a probe's ``__file__``) and of cuflash in its traceback."""
    name = script.replace("\\", "/").split("/")[-1]
    where = []
    for fr in traceback.extract_tb(e.__traceback__):
        fn = fr.filename.replace("\\", "/")
        if fn.endswith(name) or "/cuflash/" in fn:
            where.append(f"{fn.split('/')[-2] + '/' if '/cuflash/' in fn else ''}{fn.split('/')[-1]}:{fr.lineno}")
    msg = " ".join(str(e).split())
    if len(msg) > 400:
        msg = msg[:400] + "..."
    return f"{type(e).__name__}: {msg} (at {' <- '.join(reversed(where[-3:]))})"
