"""Ask the image's loader: import the venv's native modules the way its users do, in fresh subprocesses.

The verdict on "does it load" is what happened when the venv's python imported the module (`import torch` first):
ImportError or another exception, a crash by signal, a hang past the time limit, or success. Never in the
checker's own process: package code (and its `.pth` files) runs only in the children. One child imports torch and
then every module of the batch (torch's ~2-4 s are paid once); a child that fails or dies is followed by one more
child per failing module alone, so the failure is attributed to the module that has it, not to an earlier one's
side effects. What an import cannot show, it does not claim: C++ code that is only run on first call was not run.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SECONDS = 180  # one child: import torch (~3 s) and the venv's native modules; a hang is a verdict, not a wait
MAX_ALONE = 12  # failing modules re-run alone; more than that many failures is one broken torch, not many
OK, FAILED, CRASHED, TIMED_OUT, EXITED, NOT_RUN = "ok", "failed", "crashed", "timed out", "exited", "not run"
# Runs in a child of the venv's python. argv: results file, JSON list of modules. One JSON line per event, flushed
# at once, so a child killed by a signal leaves the events up to the module that killed it.
_CHILD = r"""
import importlib, json, os, sys
out = open(sys.argv[1], "a", buffering=1)
def say(*event):
    out.write(json.dumps(event) + "\n")
    out.flush()
say("begin")
for name in json.loads(sys.argv[2]):
    say("start", name)
    try:
        importlib.import_module(name)
    except BaseException as error:
        words, cause = [str(error)], error.__cause__ or error.__context__
        while cause is not None and len(words) < 4:  # "Could not load this library" <- the loader's own words
            words.append("%s: %s" % (type(cause).__name__, cause))
            cause = cause.__cause__ or cause.__context__
        say("fail", name, type(error).__name__, " <- ".join(words)[:4000])
    else:
        say("ok", name)
torch = sys.modules.get("torch")
flag = getattr(getattr(torch, "_C", None), "_GLIBCXX_USE_CXX11_ABI", None)
say("abi", None if flag is None else ("cxx11" if flag else "pre-cxx11"))
maps = set()
try:
    with open("/proc/self/maps") as handle:
        for line in handle:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                maps.add(parts[5].strip())
except OSError:
    pass
say("maps", sorted(maps), len(sys.modules))
say("end")
"""


@dataclass
class Outcome:
    module: str
    status: str  # OK | FAILED | CRASHED | TIMED_OUT | EXITED | NOT_RUN
    error: str = ""  # the exception type, the signal, the exit code
    message: str = ""
    alone: bool = False  # the verdict of a child that imported torch and this module only

    def to_json(self) -> dict:
        return {"module": self.module, "status": self.status, "error": self.error, "message": self.message,
                "alone": self.alone}


@dataclass
class ChildRun:
    events: list[list] = field(default_factory=list)
    returncode: int | None = None
    timed_out: bool = False
    stderr: str = ""

    def ended(self) -> bool:
        return any(event[0] == "end" for event in self.events)

    def began(self) -> bool:
        return any(event[0] == "begin" for event in self.events)


@dataclass
class Loading:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    torch_abi: str | None = None
    mapped: set[str] = field(default_factory=set)  # real paths of every file the children mapped
    modules_loaded: int = 0  # sys.modules after the batch's imports
    children: int = 0
    startup: str = ""  # the interpreter did not reach the imports: why

    def failures(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes.values() if outcome.status != OK]


def run_child(python: Path, modules: list[str], seconds: float) -> ChildRun:
    """One fresh child of the venv's python importing modules in order; it runs in its own session so a hang is
    ended with everything it started."""
    with tempfile.TemporaryDirectory(prefix="xla-images-check-") as scratch:
        results = os.path.join(scratch, "events")
        process = subprocess.Popen([str(python), "-c", _CHILD, results, json.dumps(modules)], cwd=scratch,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   start_new_session=True)
        run = ChildRun()
        try:
            _, stderr = process.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            run.timed_out = True
            _kill_group(process)
            _, stderr = process.communicate(timeout=30)
        run.returncode, run.stderr = process.returncode, stderr.decode("utf-8", errors="replace")[-4000:]
        run.events = _read_events(results)
    return run


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except OSError:
        process.kill()


def _read_events(path: str) -> list[list]:
    events = []
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a crash
    except OSError:
        pass
    return events


def _how_it_ended(run: ChildRun) -> tuple[str, str]:
    if run.timed_out:
        return TIMED_OUT, "no answer in the time limit"
    code = run.returncode or 0
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return CRASHED, name
    return EXITED, f"exit {code}"


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def outcomes_of(run: ChildRun, modules: list[str]) -> tuple[dict[str, Outcome], list[str]]:
    """The verdicts a child's events give, and the modules it never reached (after a crash, a hang or an exit)."""
    outcomes: dict[str, Outcome] = {}
    started = None
    for event in run.events:
        if event[0] == "start":
            started = event[1]
        elif event[0] == "ok":
            outcomes[event[1]], started = Outcome(event[1], OK), None
        elif event[0] == "fail":
            outcomes[event[1]], started = Outcome(event[1], FAILED, event[2], event[3]), None
    if started is not None and not run.ended():
        status, error = _how_it_ended(run)
        outcomes[started] = Outcome(started, status, error, _last_line(run.stderr))
    return outcomes, [module for module in modules if module not in outcomes]


def _absorb(loading: Loading, run: ChildRun) -> None:
    loading.children += 1
    for event in run.events:
        if event[0] == "abi" and event[1]:
            loading.torch_abi = event[1]
        elif event[0] == "maps":
            loading.mapped.update(os.path.realpath(path) for path in event[1])
            loading.modules_loaded = max(loading.modules_loaded, event[2])


def load_modules(python: Path, modules: list[str], *, first: str | None = "torch",
                 seconds: float = SECONDS) -> Loading:
    """Import `first` then modules in batches; every failure re-run alone (torch first) to attribute it."""
    loading = Loading()
    prefix = [first] if first else []
    batch = [module for module in modules if module != first]
    while True:
        run = run_child(python, prefix + batch, seconds)
        _absorb(loading, run)
        if not run.began():
            status, error = _how_it_ended(run)
            loading.startup = (f"the venv's python {status} ({error}) before it imported anything: "
                               f"{_last_line(run.stderr) or 'a .pth file or sitecustomize ended it'}")
            return loading
        found, unreached = outcomes_of(run, prefix + batch)
        loading.outcomes.update({name: outcome for name, outcome in found.items() if name not in loading.outcomes})
        batch = [module for module in unreached if module not in prefix]
        if batch and (not found or any(found.get(name, Outcome(name, NOT_RUN)).status not in (OK, FAILED)
                                       for name in prefix)):
            # torch itself crashed or hung: every child would stop there; the rest is not judged.
            loading.outcomes.update({name: Outcome(name, NOT_RUN) for name in batch})
            batch = []
        if not batch:
            break
    _confirm_alone(python, loading, prefix, seconds)
    return loading


def _confirm_alone(python: Path, loading: Loading, prefix: list[str], seconds: float) -> None:
    """A module that failed in a batch is imported again alone (torch first); its own verdict stands."""
    if prefix and loading.outcomes.get(prefix[0], Outcome("", OK)).status != OK:
        return  # torch itself does not import: every module after it fails for that one reason
    suspects = [outcome for outcome in loading.failures()
                if outcome.module not in prefix and outcome.status != TIMED_OUT]
    for outcome in suspects[:MAX_ALONE]:
        run = run_child(python, prefix + [outcome.module], seconds)
        _absorb(loading, run)
        found, _ = outcomes_of(run, prefix + [outcome.module])
        alone = found.get(outcome.module)
        if alone is None:
            status, error = _how_it_ended(run)
            alone = Outcome(outcome.module, status, error, _last_line(run.stderr))
        alone.alone = True
        loading.outcomes[outcome.module] = alone
