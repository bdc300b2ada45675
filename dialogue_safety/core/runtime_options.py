"""The one translation of settings into :class:`dialogue_safety.core.runtime.OnnxClassifier` arguments.

``dialogue-safety serve``, ``dialogue-safety score`` (local and on Ray) and the Python API
(:func:`dialogue_safety.load`) build their runtime from :func:`runtime_options`, so that a setting
(providers, threads, spinning, batch budget, window cap, language check, the thresholds the int8
check watches) means the same thing wherever a model is run. The settings are read by attribute
(:class:`RuntimeSettings`: the service's ``ServiceSettings`` has them), so this ground-floor module
imports nothing above it.
"""

from __future__ import annotations

from typing import Any, Protocol


class RuntimeSettings(Protocol):
    """The settings the runtime is built from (``dialogue_safety.service.settings.ServiceSettings``)."""

    @property
    def variant(self) -> str | None: ...
    @property
    def provider_list(self) -> list[str] | None: ...
    @property
    def intra_op_threads(self) -> int | None: ...
    @property
    def allow_spinning(self) -> bool | None: ...
    @property
    def max_batch_tokens(self) -> int: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def max_windows(self) -> int: ...
    @property
    def language_check(self) -> bool: ...
    @property
    def threshold(self) -> float | None: ...


def runtime_options(settings: RuntimeSettings | None = None, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for ``OnnxClassifier(model_dir, **options)``: those ``settings`` set (none: the
    runtime's defaults), then ``overrides`` that are not None (e.g. a command's ``variant`` or a Ray
    actor's ``intra_op_threads``). A setting left unset is left out, so the runtime's default applies."""
    options: dict[str, Any] = {}
    if settings is not None:
        options = {
            "variant": settings.variant,
            "providers": settings.provider_list,
            "intra_op_threads": settings.intra_op_threads,
            "allow_spinning": settings.allow_spinning,
            "max_batch_tokens": settings.max_batch_tokens,
            "max_batch_size": settings.max_batch_size,
            "max_windows": settings.max_windows,
            "language_check": settings.language_check,
            # the int8 check also covers the threshold the operator decides at
            "thresholds": () if settings.threshold is None else (settings.threshold,),
        }
    options.update({name: value for name, value in overrides.items() if value is not None})
    return {name: value for name, value in options.items() if value is not None}
