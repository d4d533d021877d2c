"""Shared pieces of the new-user probes (newuser_probe.py, newuser_attn_probe.py, newuser_amp_probe.py,
newuser_tools_probe.py): the step outcomes, how an unexpected exception is reported, the GPU's name for the
header line, the watchdog that ends a hung run and the check that a call raises a clear error. Each probe keeps
its own Check class and check loop (their steps record skips, notes and deadlines differently)."""
import os
import threading
import time
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


def gpu_name(cp, with_cc=False):
    """The current CUDA device's name (with its compute capability if ``with_cc``); raises what CuPy raises."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    return name + (f" (compute capability {cp.cuda.Device().compute_capability})" if with_cc else "")


def start_watchdog(t0, hard, state, counts, why="hung kernel or far too slow", on_abort=None, period=1.0):
    """A daemon thread that ends the process (exit status 1) once ``hard`` seconds have passed since ``t0``: it
    reports the running check (``state["name"]``, started at ``state["t"]``) as failed, calls ``on_abort()`` if
    given, and prints the SUMMARY line from ``counts`` (PASS / FAIL / SKIP). Checked every ``period`` seconds."""
    def watch():
        while True:
            time.sleep(period)
            if time.time() - t0 > hard:
                print(f"FAIL {state['name']}: still running {time.time() - state['t']:.0f} s into the check, "
                      f"{time.time() - t0:.0f} s in all ({why}); watchdog exit", flush=True)
                if on_abort is not None:
                    on_abort()
                print(f"SUMMARY: {counts['PASS']} passed, {counts['FAIL'] + 1} failed, {counts['SKIP']} skipped "
                      f"(aborted by the watchdog)", flush=True)
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def raises_naming(what, exc, words, call, describe, exc_text_of):
    """``call()`` must raise ``exc`` whose message contains every word of ``words`` (case-insensitive; a word "a|b"
    is satisfied by either); returns the exception, else raises Fail. ``describe(r)`` shows a value returned
    instead, ``exc_text_of(e)`` an exception of another type (each probe's own)."""
    try:
        r = call()
    except exc as e:
        msg = str(e)
        missing = [w for w in words if not any(a.lower() in msg.lower() for a in w.split("|"))]
        if missing:
            raise Fail(f"{what}: {type(e).__name__} raised, but its message does not name {missing}: {msg[:300]!r}")
        return e
    except Exception as e:
        raise Fail(f"{what}: expected {exc.__name__} naming {list(words)}, got {exc_text_of(e)}")
    raise Fail(f"{what}: expected {exc.__name__} naming {list(words)}, got no error (returned {describe(r)})")
