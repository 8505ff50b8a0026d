"""The typed configuration: ``params.yaml`` sections parsed into dataclasses.

This module is the only place that reads ``params.yaml``. Each top-level section maps to one dataclass of
`pipeline/sections.py` (all of them in one module). A command loads only the sections its stage module names in
``SECTIONS`` (`load_config(..., sections=...)`): only they are typed and validated, so a setting of another stage
never fails this one. Unknown or mistyped keys of a loaded
section fail with a `ConfigError` that names the key and the file; an unknown section name always fails.
Command-line overrides use dotted keys (``--set decode.max_new_tokens=32``) and are typed the same way as
the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Union

import yaml

from decoding.errors import UserInputError
from pipeline.sections import SECTION_CLASSES, section_class

SECTIONS = tuple(SECTION_CLASSES)  # every section name, in params.yaml order


class ConfigError(UserInputError):
    """A configuration file or override is malformed; the message names the key and the source."""


class Config:
    """The sections a command loaded, as attributes named like params.yaml's sections (``cfg.collect``),
    and where their values came from. ``Config()`` holds every section at its defaults.

    Reading a section the command did not load is a bug in the stage module (its ``SECTIONS`` misses it)
    and raises AttributeError naming the section."""

    def __init__(self, sections: dict[str, Any] | None = None, source: str = "<defaults>",
                 params_digest: str | None = None):
        if sections is None:
            sections = {name: section_class(name)() for name in SECTIONS}
        unknown = [name for name in sections if name not in SECTION_CLASSES]
        if unknown:
            raise ValueError(f"unknown config sections {unknown}")
        self.__dict__["_sections"] = {name: sections[name] for name in SECTIONS if name in sections}
        self.source = source
        # what the whole params file said (every section, loaded or not): the key of a pipeline run
        self.params_digest = params_digest or _digest(self.to_dict())

    def __getattr__(self, name: str):
        sections = self.__dict__.get("_sections", {})
        if name in sections:
            return sections[name]
        if name in SECTION_CLASSES:
            raise AttributeError(f"config section '{name}' was not loaded (loaded: {', '.join(sections)}): the "
                                 f"command's stage module must name it in SECTIONS")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __eq__(self, other) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    @property
    def loaded(self) -> tuple[str, ...]:
        """The names of the sections this config holds."""
        return tuple(self._sections)

    def replace(self, **sections) -> Config:
        """A copy with some sections replaced (``cfg.replace(train=dataclasses.replace(cfg.train, epochs=2))``)."""
        return Config({**self._sections, **sections}, self.source, self.params_digest)

    def to_dict(self) -> dict:
        return {name: dataclasses.asdict(section) for name, section in self._sections.items()}


def _digest(raw: dict) -> str:
    return hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (int, float, str, bool, X | None, list[X], Any)."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: unexpected value {value!r}")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    else:
        raise ConfigError(f"{where}: unsupported annotation {tp!r}")
    raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")


def _build_section(name: str, values: Any, source: str):
    cls = section_class(name)
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: section '{name}' must be a mapping, got {values!r}")
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key '{name}.{key}' (known keys of '{name}': {', '.join(known)})")
        kwargs[key] = _coerce(value, hints[key], f"{source}: '{name}.{key}'")
    section = cls(**kwargs)
    validate = getattr(section, "validate", None)
    if validate is not None:
        try:
            validate()
        except ValueError as e:
            raise ConfigError(f"{source}: section '{name}': {e}") from None
    return section


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` -> (section, key, YAML-parsed value)."""
    key, sep, raw = text.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not section or not name:
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. decode.max_new_tokens=32")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: value is not valid YAML ({e.problem})") from None
    return section, name, value


EXTENDS = "extends"  # top-level key of a params file: the file it is a partial override of


def _read_params(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    """The sections of a params file; with ``extends: <file>`` (relative to this file's folder) its sections
    are merged key by key over that file's (a preset that changes a few keys of params.yaml)."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}" + (f" (extended by {chain[-1]})" if chain else ""))
    if path.resolve() in [p.resolve() for p in chain]:
        raise ConfigError(f"{path}: '{EXTENDS}' forms a cycle: {' -> '.join(map(str, (*chain, path)))}")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(loaded).__name__}")
    raw = {k: dict(v) if isinstance(v, dict) else v for k, v in loaded.items()}
    base_name = raw.pop(EXTENDS, None)
    if base_name is None:
        return raw
    if not isinstance(base_name, str):
        raise ConfigError(f"{path}: '{EXTENDS}' must be a file name (relative to {path.parent}), got {base_name!r}")
    merged = _read_params(path.parent / base_name, (*chain, path))
    for name, values in raw.items():
        if isinstance(values, dict) and isinstance(merged.get(name), dict):
            merged[name] = {**merged[name], **values}
        else:
            merged[name] = values
    return merged


def _apply_overrides(raw: dict, overrides: list[str], source: str) -> set[str]:
    """Set each ``section.key=value`` of ``overrides`` in ``raw`` (in place, parsed once each, later ones win);
    returns the sections they name."""
    overridden = set()
    for text in overrides:
        section, key, value = parse_override(text)
        if section not in SECTION_CLASSES:
            raise ConfigError(f"--set {text!r}: unknown section '{section}' (known: {', '.join(SECTIONS)})")
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise ConfigError(f"{source}: section '{section}' must be a mapping")
        raw[section][key] = value
        overridden.add(section)
    return overridden


def load_config(path: str | Path | None = "params.yaml", overrides: list[str] = (),
                sections: tuple[str, ...] | None = None) -> Config:
    """Read ``path`` (missing file = defaults only when path is None; ``extends:`` merges it over another
    params file, see `_read_params`), then apply ``overrides``; build and validate ``sections`` (None = all)
    and the sections ``overrides`` name."""
    raw: dict = {}
    source = "<defaults>"
    if path is not None:
        path = Path(path)
        source = str(path)
        raw = _read_params(path)
    for name in raw:
        if name not in SECTION_CLASSES:
            raise ConfigError(f"{source}: unknown section '{name}' (known: {', '.join(SECTIONS)})")
    wanted = SECTIONS if sections is None else tuple(sections)
    for name in wanted:
        if name not in SECTION_CLASSES:
            raise ValueError(f"unknown config section {name!r} requested (known: {', '.join(SECTIONS)})")
    overridden = _apply_overrides(raw, overrides, source)
    if overrides:
        source = f"{source} + --set"
        # an overridden section is typed and validated too, also when the command does not read it (scripts
        # pass one list of overrides to several commands; a typo in it still fails)
        wanted = tuple(name for name in SECTIONS if name in wanted or name in overridden)
    built = {name: _build_section(name, raw.get(name), source) for name in wanted}
    return Config(built, source=source, params_digest=_digest(raw))


def dump_params(cfg: Config) -> str:
    """The resolved config as a full params file (e.g. a preset materialised as params.yaml for `dvc exp run`)."""
    return f"# resolved from {cfg.source}\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False)


if __name__ == "__main__":  # python -m pipeline.config configs/quick.yaml [section.key=value ...] > params.yaml
    import sys

    USAGE = ("usage: python -m pipeline.config PARAMS_FILE [section.key=value ...]\n\n"
             "Prints PARAMS_FILE resolved (its `extends:` chain, the overrides, every default filled in and checked) "
             "as a params file,\ne.g. `python -m pipeline.config configs/quick.yaml model.device=cuda > params.yaml`.")
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(USAGE)
        sys.exit(0)
    if len(sys.argv) < 2:  # to stderr: stdout is often redirected into params.yaml
        sys.exit(USAGE)
    try:
        print(dump_params(load_config(sys.argv[1], sys.argv[2:])), end="")
    except ConfigError as e:
        sys.exit(f"pipeline.config: {e}")
