"""What differs between the transformers versions we support, found out once instead of assumed.

- *the floor*: ``TRANSFORMERS_FLOOR``, the lowest transformers release we test (CI's ``make test-floor`` runs the
  engine, self-draft, half-precision and loading tests on it); pyproject.toml declares the same floor
  (``tests/test_transformers_floor.py`` checks they agree). `require_transformers` turns an older install into
  one line naming the version needed, before any model is loaded, instead of a traceback from inside a step.
- *the cache keyword*: the keyword under which a module's ``forward`` takes the KV cache. transformers 5.25
  renamed it ``cache`` (models and decoder layers); 5.17 takes ``past_key_values``; releases before 4.56 named
  a decoder layer's ``past_key_value``. Every layer's ``forward`` also takes ``**kwargs``, so a cache passed
  under the wrong name is silently dropped and never filled. `cache_keyword` reads the signature once per class
  (the engine's own probe, `engine.cache.declared_cache_kwarg`).
"""

from __future__ import annotations

from decoding.errors import UserInputError

TRANSFORMERS_FLOOR = "5.17.0"


class UnsupportedTransformersError(UserInputError):
    """The installed transformers is older than `TRANSFORMERS_FLOOR`."""


def _release(version: str) -> tuple[int, ...]:
    """``"5.17.0.dev0"`` -> ``(5, 17, 0)``: the release numbers (a dev or rc build counts as its release)."""
    from packaging.version import Version

    return Version(version).release


def transformers_version() -> str:
    """The version of the transformers this process imports."""
    import transformers

    return transformers.__version__


def require_transformers(version: str | None = None) -> None:
    """Raise `UnsupportedTransformersError` (one line) when transformers ``version`` (default:
    `transformers_version`) is older than `TRANSFORMERS_FLOOR`."""
    version = transformers_version() if version is None else version
    if _release(version) < _release(TRANSFORMERS_FLOOR):
        raise UnsupportedTransformersError(
            f"transformers {version} is installed; branchpoint needs transformers>={TRANSFORMERS_FLOOR} "
            f"(pip install 'transformers>={TRANSFORMERS_FLOOR}')")


def cache_keyword(module) -> str:
    """The keyword under which ``module.forward`` takes the KV cache (`engine.cache.declared_cache_kwarg`);
    a forward that names none of them is an error here, where a cache must reach HF's layers."""
    # imported at first use: it loads torch and transformers
    from engine.cache import CACHE_KEYWORDS, declared_cache_kwarg

    found = declared_cache_kwarg(module)
    if found is None:
        raise TypeError(f"{type(module).__name__}.forward takes the KV cache under none of "
                        f"{', '.join(CACHE_KEYWORDS)}; transformers>={TRANSFORMERS_FLOOR} layers and models take one")
    return found


def cache_kwargs(module, cache) -> dict:
    """``{keyword: cache}`` for calling ``module`` (see `cache_keyword`)."""
    return {cache_keyword(module): cache}
