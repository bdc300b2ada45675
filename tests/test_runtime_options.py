"""One translation of settings into OnnxClassifier arguments (``runtime_options``): serve, score (local
and each Ray actor) and the Python API build the same runtime from the same settings, on the tiny
exported model (real ONNX Runtime sessions)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service_conftest import tiny_model_dir  # noqa: F401

from dialogue_safety.core.limits import Limits
from dialogue_safety.core.runtime_options import runtime_options
from dialogue_safety.corpus.job import ScoreJob, load_classifier
from dialogue_safety.service.settings import ServiceSettings
from dialogue_safety.service.state import load_onnx_classifier

SETTINGS = {
    "variant": "fp32",
    "providers": "CPUExecutionProvider",
    "intra_op_threads": 1,
    "allow_spinning": False,
    "max_batch_tokens": 512,
    "max_batch_size": 16,
    "max_windows": 7,
    "language_check": False,
    "threshold": 0.3,
}


def built(classifier: Any) -> dict[str, Any]:
    """What a classifier was built with, as far as the settings reach it."""
    return {
        "variant": classifier.variant,
        "provider": classifier.provider,
        "intra_op_threads": classifier.intra_op_threads,
        "max_batch_tokens": classifier.max_batch_tokens,
        "max_batch_size": classifier.max_batch_size,
        "max_windows": classifier.max_windows,
        "language_check": classifier.language_check,
        "check_thresholds": classifier.check_thresholds,
    }


def test_settings_become_the_runtime_arguments_and_unset_ones_are_left_to_the_runtime() -> None:
    settings = ServiceSettings(**SETTINGS)
    assert runtime_options(settings) == {
        "variant": "fp32",
        "providers": ["CPUExecutionProvider"],
        "intra_op_threads": 1,
        "allow_spinning": False,
        "max_batch_tokens": 512,
        "max_batch_size": 16,
        "max_windows": 7,
        "language_check": False,
        "thresholds": (0.3,),
    }
    defaults = runtime_options(ServiceSettings())
    assert "providers" not in defaults and "intra_op_threads" not in defaults and "allow_spinning" not in defaults
    assert runtime_options(settings, variant="int8", intra_op_threads=None)["variant"] == "int8"
    assert runtime_options(settings, intra_op_threads=None)["intra_op_threads"] == 1  # None overrides nothing
    assert runtime_options() == {} and runtime_options(variant=None) == {}


def test_serve_score_and_a_ray_actor_build_the_same_runtime(tiny_model_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    settings = ServiceSettings(model_dir=tiny_model_dir, **SETTINGS)
    served = built(load_onnx_classifier(settings))
    (tmp_path / "in.csv").write_text("utterance\nhello\n")
    job = ScoreJob(tmp_path / "in.csv", tmp_path / "out.csv", model_dir=tiny_model_dir, threshold=0.3)
    # what dialogue-safety score hands each Ray actor, which runs its own threads (here the same: 1)
    actor = built(
        load_classifier(job, intra_op_threads=1, limits=Limits(max_windows=7), runtime=runtime_options(settings))
    )
    assert served == actor
    assert 0.3 in served["check_thresholds"] and served["max_batch_tokens"] == 512
