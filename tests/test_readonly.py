"""On a read-only file system the error names the output the user asked for (issue 20, item 2).

Before, every writer reported our hidden staging path
(``…/.x.nemo.nemo-convert-partial-23774-658343f4: Read-only file system``): the cleanup's
``unlink`` of the staging name failed with ``EROFS`` too, and that second error replaced the
first. The test in ``test_first_steps.py`` only monkeypatched ``os.mkdir``; these run the
commands against a **real** read-only mount: a tmpfs mounted and remounted ``ro`` inside a
private mount namespace of the test's own (``unshare -rm``, so no privileges are needed where
unprivileged user namespaces are allowed), and a folder without write permission (for root,
whom permissions do not stop, in a user namespace without any uid mapped: ``unshare -U``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from nemo_convert import api
from tiny_models import make_tiny_llama

#: Runs each command line of argv[1] (a JSON list) in-process; prints [[code, stdout, stderr], …].
_RUNNER = """
import contextlib, io, json, sys
from nemo_convert.cli.main import main
results = []
for argv in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    base = tmp_path_factory.mktemp("ro_src")
    hf = make_tiny_llama(str(base / "hf"))
    api.import_hf(hf, str(base / "m.nemo"))
    return {"hf": hf, "nemo": str(base / "m.nemo"), "tok": os.path.join(hf, "tokenizer.model")}


def _commands(src: dict[str, str], where: str) -> list[tuple[list[str], str]]:
    """(command line, the output it names) for every writer, into folder ``where``."""
    return [
        (["import", src["hf"], "-o", f"{where}/x.nemo"], f"{where}/x.nemo"),
        (["import", src["hf"], "-o", f"{where}/x.nemo", "--unpacked"], f"{where}/x.nemo"),
        (["export", src["nemo"], "-o", f"{where}/x"], f"{where}/x"),
        (["reshard", src["nemo"], "-o", f"{where}/r.nemo", "--tp", "2"], f"{where}/r.nemo"),
        (["quantize", src["nemo"], "-o", f"{where}/q.qnemo", "--algo", "none"], f"{where}/q.qnemo"),
        (["quantize", src["nemo"], "-o", f"{where}/q.qnemo", "--algo", "none", "--compress"], f"{where}/q.qnemo"),
        (["tokenizer", "add-tokens", src["tok"], "-o", f"{where}/t.model", "--tokens", "<x>"], f"{where}/t.model"),
        (["tokenizer", "add-tokens", src["nemo"], "-o", f"{where}/t.nemo", "--tokens", "<x>"], f"{where}/t.nemo"),
        (["import", src["hf"], "-o", f"{where}/mb", "--to", "megatron-bridge"], f"{where}/mb"),
        (["import", src["hf"], "-o", f"{where}/new/deeper/x.nemo"], f"{where}/new"),  # a folder it must create
    ]


def _check(results: list, commands: list[tuple[list[str], str]], strerror: str) -> None:
    for (code, out, err), (argv, named) in zip(results, commands):
        assert code == 2, (argv, err)
        assert ".nemo-convert-" not in err + out, (argv, err)
        assert err.splitlines()[-1] == f"nemo-convert: error: {named}: {strerror}", (argv, err)
        if "--json" in argv:
            assert json.loads(out) == {"error": f"{named}: {strerror}", "kind": type_of(strerror)}


def type_of(strerror: str) -> str:
    return {"Read-only file system": "OSError", "Permission denied": "PermissionError"}[strerror]


@pytest.mark.slow  # a subprocess in its own mount namespace
def test_a_read_only_mount_names_the_output(src, tmp_path):
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) to make a private read-only mount")
    ro = tmp_path / "ro"
    ro.mkdir()
    commands = _commands(src, f"{ro}/sub")
    argvs = [argv for argv, _ in commands] + [commands[0][0] + ["--json"], commands[2][0] + ["--json"]]
    script = (f"mount -t tmpfs none {ro} && mkdir {ro}/sub && mount -o remount,ro {ro} && "
              f"exec {sys.executable} -c \"$RUNNER\" \"$ARGVS\"")
    probe = subprocess.run([unshare, "-rm", "sh", "-c", f"mount -t tmpfs none {ro}"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"this sandbox forbids a private mount namespace (unshare -rm: {probe.stderr.strip()})")
    env = dict(os.environ, RUNNER=_RUNNER, ARGVS=json.dumps(argvs))
    proc = subprocess.run([unshare, "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout.splitlines()[-1])
    _check(results, commands + [commands[0], commands[2]], "Read-only file system")
    assert os.listdir(ro) == []  # the namespace's mount is gone with it; ours never held anything


@pytest.mark.slow  # a subprocess
def test_a_folder_without_write_permission_names_the_output(src, tmp_path):
    """Root ignores permissions; run as root, the commands run in a user namespace of their
    own without any uid mapped (``unshare -U``), where root's capabilities do not reach our
    files and the folder's mode bits apply."""
    prefix: list[str] = []
    if os.geteuid() == 0:
        unshare = shutil.which("unshare")
        probe = subprocess.run([unshare or "unshare", "-U", "true"], capture_output=True, text=True) \
            if unshare else None
        if probe is None or probe.returncode != 0:
            pytest.skip("running as root, where permissions do not bite, and no user namespace to drop root in")
        prefix = [unshare, "-U"]
    locked = tmp_path / "locked"
    (locked / "sub").mkdir(parents=True)
    os.chmod(locked / "sub", 0o555)
    os.chmod(locked, 0o555)
    try:
        commands = _commands(src, f"{locked}/sub")
        argvs = [argv for argv, _ in commands] + [commands[0][0] + ["--json"]]
        proc = subprocess.run([*prefix, sys.executable, "-c", _RUNNER, json.dumps(argvs)], capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        _check(json.loads(proc.stdout.splitlines()[-1]), commands + [commands[0]], "Permission denied")
        assert os.listdir(locked / "sub") == []
    finally:
        os.chmod(locked, 0o755)
        os.chmod(locked / "sub", 0o755)
