"""Compile the hot paths (`checking.native.COMPILED`) with mypyc into the venv's build directory; `make venv` runs it.

    .venv/bin/python tools/build_native.py

The modules are compiled from their own source, under their own names, into `checking.native.BUILD_DIR` (never next
to the source), with a manifest of each source's SHA-256 (`checking.native` runs the source instead of a build whose
source changed). A build that fails for any reason (no mypyc, no C compiler, a type error) leaves no build, prints one
line and exits 0: the pure Python source then runs, and the install is never broken by it. The compiler's own output
goes to `BUILD_DIR.log`."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from checking.native import BUILD_DIR, COMPILED, MANIFEST, SHARED_LIB, source_digest  # noqa: E402

#: mypy's options for the compiled modules: imports of other modules are followed for their types only.
MYPY_OPTIONS = ["--follow-imports=silent", "--ignore-missing-imports", "--no-warn-unused-configs",
                "--python-version=3.11"]


@contextlib.contextmanager
def _output_to(path: str) -> Iterator[None]:
    """The process's stdout and stderr (the C compiler's included) into `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def _build(out: str, temp: str) -> str:
    """Compile every module of `COMPILED` into `out`; the shared library's file name (relative to `out`)."""
    from mypyc.build import mypycify
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    paths = [os.path.join(*package.split("."), f"{name}.py") for package, names in COMPILED.items() for name in names]
    extensions = mypycify(paths + MYPY_OPTIONS, opt_level="3", group_name=SHARED_LIB.removesuffix("__mypyc"),
                          target_dir=os.path.join(temp, "c"), multi_file=True)
    dist = Distribution({"ext_modules": extensions, "script_name": "tools/build_native.py"})
    cmd = build_ext(dist)
    cmd.build_lib, cmd.build_temp, cmd.parallel = out, os.path.join(temp, "o"), os.cpu_count() or 1
    cmd.ensure_finalized()
    cmd.run()
    libs = [f for f in os.listdir(out) if f.startswith(SHARED_LIB + ".")]
    if len(libs) != 1:
        raise RuntimeError(f"expected one {SHARED_LIB} library in the build, found {libs}")
    return libs[0]


def main() -> int:
    t0 = time.monotonic()
    log = BUILD_DIR + ".log"
    digests = {f"{p}.{n}": source_digest(f"{p}.{n}") for p, names in COMPILED.items() for n in names}
    shutil.rmtree(BUILD_DIR, ignore_errors=True)
    os.makedirs(os.path.dirname(BUILD_DIR), exist_ok=True)
    temp = tempfile.mkdtemp(prefix="shardcheck-native-")
    cwd = os.getcwd()
    try:
        out = os.path.join(temp, "lib")
        os.chdir(ROOT)  # mypy names each module by its path from here
        with _output_to(log):
            lib = _build(out, temp)
        with open(os.path.join(out, MANIFEST), "w") as f:
            json.dump({"modules": digests, "shared_lib": lib, "python": sys.version.split()[0]}, f, indent=1)
        shutil.move(out, BUILD_DIR)
    except BaseException as exc:  # noqa: BLE001 -- whatever failed, the pure source runs and the install goes on
        shutil.rmtree(BUILD_DIR, ignore_errors=True)
        if isinstance(exc, KeyboardInterrupt):
            raise
        print(f"shardcheck: the compiled hot paths did not build ({type(exc).__name__}: {str(exc)[:200]}; see {log}): "
              "pure Python runs", file=sys.stderr)
        return 0
    finally:
        os.chdir(cwd)
        shutil.rmtree(temp, ignore_errors=True)
    print(f"shardcheck: compiled {len(digests)} hot modules with mypyc in {time.monotonic() - t0:.0f} s "
          f"({BUILD_DIR})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
