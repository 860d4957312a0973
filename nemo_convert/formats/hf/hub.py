"""Hugging Face hub ids (``meta-llama/Llama-3.2-1B``) resolved from the local hub cache.

Nothing is downloaded, and ``huggingface_hub`` is not needed: the cache layout is read
directly — ``<cache>/models--<org>--<name>/refs/<revision>`` holds a commit hash and
``snapshots/<commit>/`` the files. The cache is where ``huggingface_hub`` puts it:
``HF_HUB_CACHE``, else ``HUGGINGFACE_HUB_CACHE``, else ``$HF_HOME/hub``, else
``$XDG_CACHE_HOME/huggingface/hub``, else ``~/.cache/huggingface/hub``.
"""

from __future__ import annotations

import os
import re

from nemo_convert.errors import InputError

#: What a hub id looks like: ``name`` or ``org/name`` (letters, digits, ``-_.``).
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_cache_dir() -> str:
    """The hub cache folder, from the environment as ``huggingface_hub`` reads it."""
    env = os.environ
    if env.get("HF_HUB_CACHE"):
        return os.path.expanduser(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return os.path.expanduser(env["HUGGINGFACE_HUB_CACHE"])
    if env.get("HF_HOME"):
        return os.path.join(os.path.expanduser(env["HF_HOME"]), "hub")
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "huggingface", "hub")


#: Names that are files of ours, not hub ids (``x.nemo`` missing is a missing file).
FILE_SUFFIXES = (".nemo", ".qnemo", ".ckpt", ".safetensors", ".bin", ".tar", ".gz", ".json", ".yaml", ".model")


def is_hub_id(src: str) -> bool:
    """Could ``src`` be a hub id? (Only asked when no such local path exists.)"""
    return bool(HUB_ID.fullmatch(src)) and ".." not in src and not src.lower().endswith(FILE_SUFFIXES)


def download_command(repo_id: str, revision: str | None = None) -> str:
    """The one command that puts ``repo_id`` into the cache."""
    rev = f" --revision {revision}" if revision else ""
    return f"hf download {repo_id}{rev}"


def cached_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | None = None,
                    needs: tuple[str, ...] = ("config.json",)) -> str | None:
    """The snapshot folder of ``repo_id`` at ``revision`` (a branch, tag or commit; default
    ``main``) in the hub cache, or None when it is not there or holds none of the files
    ``needs`` names (a model needs ``config.json``; a tokenizer fetched alone has only its
    ``tokenizer*`` files)."""
    cache = cache_dir or hub_cache_dir()
    repo = os.path.join(cache, "models--" + repo_id.replace("/", "--"))
    rev = revision or "main"
    commit = None
    ref = os.path.join(repo, "refs", rev)
    if os.path.isfile(ref):
        try:
            with open(ref, encoding="utf-8") as f:
                commit = f.read().strip()
        except OSError:
            return None
    elif _COMMIT.fullmatch(rev):
        commit = rev
    if not commit or "/" in commit or commit in (".", ".."):
        return None
    snap = os.path.join(repo, "snapshots", commit)
    return snap if any(os.path.isfile(os.path.join(snap, n)) for n in needs) else None


def resolve_hf_source(src: str | os.PathLike[str], revision: str | None = None) -> str:
    """``src`` itself when it exists locally; else, when it looks like a hub id, its snapshot
    folder in the local hub cache. Raises :class:`InputError` naming the download command
    when a hub id ``org/name`` is not cached; a missing path that is no hub id, or a bare
    ``name`` that is not cached (more likely a mistyped folder than a model id), is returned
    unchanged (the command then says it does not exist)."""
    src = os.fspath(src)
    if os.path.exists(src):
        if revision:
            raise InputError(f"{src}: --revision applies to Hugging Face hub ids; this is a local path")
        return src
    if not is_hub_id(src):
        return src
    snap = cached_snapshot(src, revision)
    if snap is not None:
        return snap
    if "/" not in src and not revision:
        return src
    at = f" at revision {revision}" if revision else ""
    raise InputError(f"{src}: no such local folder, and the Hugging Face model {src}{at} is not in the hub "
                     f"cache ({hub_cache_dir()}); nemo-convert never downloads: run "
                     f"`{download_command(src, revision)}` (or `huggingface-cli download "
                     f"{src}{' --revision ' + revision if revision else ''}`), then this command again")
