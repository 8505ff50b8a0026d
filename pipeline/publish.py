"""``branchpoint publish``: record this machine's pipeline run and publish its selector (what ``make main`` runs
after ``dvc repro``).

1. the DVC remote: the repository's default remote when one is configured (any DVC remote: ``dvc remote add
   -d NAME URL``), else ``--remote`` (default ``.dvc-storage``, a local folder) added as this checkout's
   default (``.dvc/config.local``);
2. ``dvc push``: the cached outputs (the selector among them) go to that remote;
3. ``dvc exp save -f -n NAME``: the workspace's run is kept as experiment NAME (default ``main``), so a later
   ``dvc exp run`` is compared with a run from the same machine (``dvc exp show``, ``dvc exp diff main``);
4. an annotated tag ``<artifact>@vX.Y.Z`` on that experiment's commit registers a new version of every artifact of
   dvc.yaml (``selector``, and ``selector_chain`` for transformers), which ``dvc artifacts get <repo> selector``
   downloads (no DVC Studio needed: without a Studio token, DVC resolves the artifact's newest version tag and reads
   the data from the remote).
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

SECTIONS = ()  # publish reads no params: it pushes what dvc repro made


ARTIFACT = "selector"  # the tree selector: what ``make main`` decodes with


def artifacts(cwd: str | Path = ".") -> list[str]:
    """The artifacts dvc.yaml declares (``artifacts:``), in its order; ``[ARTIFACT]`` when it declares none."""
    import yaml

    path = Path(cwd) / "dvc.yaml"
    declared = (yaml.safe_load(path.read_text()) or {}).get("artifacts") if path.is_file() else None
    return list(declared or [ARTIFACT])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remote", default=".dvc-storage",
                        help="DVC remote URL (or folder) to add as this checkout's default when the repository "
                             "has none (default: %(default)s)")
    parser.add_argument("--name", default="main", help="experiment name of this run (default: %(default)s)")
    parser.add_argument("--no-tag", action="store_true", help="do not register a new selector version")


def _run(*cmd: str, cwd: str | Path = ".") -> str:
    from decoding.errors import UserInputError

    done = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise UserInputError(f"`{' '.join(cmd)}` failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done.stdout.strip()


def ensure_remote(url: str, cwd: str | Path = ".") -> str:
    """The default DVC remote's name; adds ``url`` as this checkout's default (``--local``) when none is set."""
    try:
        name = _run("dvc", "remote", "default", cwd=cwd)
    except Exception:  # noqa: BLE001 - `dvc remote default` fails when none is set
        name = ""
    if name:
        return name
    if "://" not in url:
        url = str((Path(cwd) / url).resolve())
        Path(url).mkdir(parents=True, exist_ok=True)
    _run("dvc", "remote", "add", "--local", "-d", "-f", "storage", url, cwd=cwd)
    return "storage"


def next_version(tags: list[str], artifact: str = ARTIFACT) -> str:
    """``artifact@vX.Y.Z`` one patch above the newest existing version tag (``v0.0.1`` for the first)."""
    versions = [tuple(map(int, m.groups())) for t in tags
                if (m := re.fullmatch(rf"{re.escape(artifact)}@v(\d+)\.(\d+)\.(\d+)", t))]
    major, minor, patch = max(versions, default=(0, 0, 0))
    return f"{artifact}@v{major}.{minor}.{patch + 1}"


def publish(remote: str = ".dvc-storage", name: str = "main", tag: bool = True, cwd: str | Path = ".") -> dict:
    """Steps 1-4 of the module docstring; returns what was done."""
    remote_name = ensure_remote(remote, cwd)
    _run("dvc", "push", "-q", cwd=cwd)
    _run("dvc", "exp", "save", "-f", "-n", name, cwd=cwd)
    refs = _run("git", "for-each-ref", "--sort=-committerdate", "--format=%(objectname)", f"refs/exps/*/*/{name}",
                cwd=cwd).split()
    sha = refs[0] if refs else _run("git", "rev-parse", "HEAD", cwd=cwd)
    out = {"remote": remote_name, "experiment": name, "commit": sha}
    if tag:
        out["versions"] = {}
        for artifact in artifacts(cwd):
            version = next_version(_run("git", "tag", "--list", f"{artifact}@v*", cwd=cwd).split(), artifact)
            _run("git", "tag", "-a", version, sha, "-m", f"Registering artifact {artifact} version "
                 f"{version.split('@')[1]} (experiment {name})", cwd=cwd)
            out["versions"][artifact] = version
    return out


def run(cfg, args) -> int:
    done = publish(args.remote, args.name, not args.no_tag)
    print(f"publish: pushed to DVC remote {done['remote']!r}; run saved as experiment {done['experiment']!r} "
          f"({done['commit'][:8]})" + ("; registered " + ", ".join(
              f"{v} (dvc artifacts get <repo> {a})" for a, v in done["versions"].items()) if done.get("versions")
                                       else ""))
    return 0
