"""ONNX variants derived from the one committed artifact, torch-free (onnx + onnxruntime only).

A model directory commits a single graph, ``model.onnx``. Everything else is derived from it,
deterministically, by the recipes recorded in the model card, at export time (to check them)
and again at the first start of the service (to serve them)::

    model.onnx ──fold──► fp32 ──ORT transformers optimizer (BERT fusions)──► optimized
                                                    └──quantize_dynamic (int8 weights)──► int8
                           └──optimizer (GPU fusions) + convert_float_to_float16──► fp16 (CUDA)

**Size cap.** The repository may commit at most 60 MB of model artifacts while MiniLM-L6 in
fp32 is ~90 MB. ``dialogue-safety export --ship`` therefore rounds the weights to fp16 *before*
the parity check and stores them as fp16 initializers, each followed by a ``Cast`` to fp32
(:func:`store_weights_fp16`, ~45 MB). The graph still computes in fp32 (onnxruntime folds the
casts when it loads it), and :func:`fold_fp16_weights` turns it back into a plain fp32 graph
exactly (fp16 → fp32 is lossless), which is what the other variants start from.

Derived files are cached next to the artifact (or in a per-user cache directory when the model
directory is read-only), written to a temporary file and renamed into place, and stamped with
the artifact's sha256 and the recipe (ONNX ``metadata_props``): a derived file whose stamp does
not match the current artifact or recipe is derived again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from service.model_card import ModelCard
from service.model_dir import ARTIFACT_FILE

log = logging.getLogger("service.variants")


VARIANT_NAMES: tuple[str, ...] = ("fp32", "optimized", "int8", "fp16")
DEFAULT_FILES: dict[str, str] = {
    "fp32": "model.fp32.onnx",  # only when model.onnx stores fp16 weights; else fp32 *is* model.onnx
    "optimized": "model.optimized.onnx",
    "int8": "model.int8.onnx",
    "fp16": "model.fp16.onnx",
}
META = "dialogue_safety."  # prefix of the metadata_props this project writes
RECIPE_VERSION = 1

# int8 recipes measured on the trained MiniLM-L6 (docs/runtime.md, "int8 recipes"): quantising
# every MatMul is ~2x faster than fp32 but moves 1-3 % of decisions; quantising only the
# attention projections moves fewer (0.1-2 %) for a ~1.2x speed-up. Node names are those of
# torch.onnx's export of Hugging Face BERT.
FFN_UP = r"intermediate/dense/MatMul$"
FFN_DOWN = r"layer\.\d+/output/dense/MatMul$"
INT8_PRESETS: dict[str, dict[str, Any]] = {
    "all": {
        "kind": "quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": True,  # 7-bit weights: no u8*s8 saturation on AVX2 CPUs without VNNI
        "op_types": ["MatMul", "Attention"],  # embeddings stay fp32
    },
    # 8-bit weights: closer to fp32 (0.3.0: no test split loses more than 0.07 F1 points, where the
    # 7-bit "all" preset loses 1.6 on ConvAbuse), but only exact on CPUs with VNNI (AVX512-VNNI or
    # AVX-VNNI): without it, u8*s8 products can saturate. The runtime falls back to the optimized
    # fp32 graph on x86 CPUs without VNNI (service.runtime.int8_supported).
    "vnni": {
        "kind": "quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": False,
        "op_types": ["MatMul", "Attention"],
    },
    "attention": {
        "kind": "quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": True,
        "op_types": ["MatMul", "Attention"],
        "exclude_patterns": [FFN_UP, FFN_DOWN],  # the feed-forward blocks stay fp32
    },
}

# How each variant is made from its source. ``from`` names another variant or "artifact".
# The card's export.recipes (written by `dialogue-safety export`) overrides these, so what the
# export validated is exactly what the service derives.
DEFAULT_RECIPES: dict[str, dict[str, Any]] = {
    "fp32": {"from": "artifact", "kind": "fold_fp16_weights"},
    "optimized": {
        "from": "fp32",
        "kind": "ort_optimizer",
        "model_type": "bert",
        "opt_level": 0,  # python fusions only: a portable graph; onnxruntime adds its own at load
        "use_gpu": False,
    },
    "int8": {"from": "optimized", **INT8_PRESETS["all"]},
    "fp16": {
        "from": "fp32",
        "kind": "float16",
        "model_type": "bert",
        "use_gpu": True,
        "keep_io_types": True,
    },
}


class VariantError(RuntimeError):
    """A variant cannot be derived (unknown name, bad recipe, or the source graph is unusable)."""


# -- fp16 weight storage (the size-cap design) ---------------------------------------------------
def store_weights_fp16(model: onnx.ModelProto, min_elements: int = 16) -> tuple[onnx.ModelProto, int]:
    """Store every fp32 initializer that fp16 represents *exactly* as fp16 followed by a Cast.

    Returns the new model and the number of initializers converted. Initializers whose values
    do not survive the fp16 round trip (e.g. ``-3.4e38`` mask constants) and tiny ones stay fp32,
    so the graph computes exactly what it computed before; round the weights to fp16 first
    (``export --ship`` does) to make all of them representable.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    graph_inputs = {i.name for i in graph.input}
    kept: list[onnx.TensorProto] = []
    casts: list[onnx.NodeProto] = []
    for init in graph.initializer:
        if init.data_type != TensorProto.FLOAT or init.name in graph_inputs:
            kept.append(init)
            continue
        arr = numpy_helper.to_array(init)
        if arr.size < min_elements:
            kept.append(init)
            continue
        with np.errstate(over="ignore"):
            half = arr.astype(np.float16)
        if not np.array_equal(half.astype(np.float32), arr):
            kept.append(init)
            continue
        stored = f"{init.name}{_FP16_SUFFIX}"
        kept.append(numpy_helper.from_array(half, stored))
        casts.append(
            helper.make_node("Cast", [stored], [init.name], name=f"{init.name}/cast_fp32", to=TensorProto.FLOAT)
        )
    del graph.initializer[:]
    graph.initializer.extend(kept)
    nodes = list(graph.node)
    del graph.node[:]
    graph.node.extend(casts + nodes)
    _set_meta(out, {"weights_storage": "fp16"})
    return out, len(casts)


_FP16_SUFFIX = "__fp16"


def fold_fp16_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """Inverse of :func:`store_weights_fp16`: fp16 initializer + Cast → fp32 initializer (exact)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    inits = {i.name: i for i in graph.initializer}
    consumers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            consumers[name] = consumers.get(name, 0) + 1
    folded: dict[str, onnx.TensorProto] = {}
    drop_nodes: set[int] = set()
    for i, node in enumerate(graph.node):
        if node.op_type != "Cast" or len(node.input) != 1 or node.input[0] not in inits:
            continue
        src = inits[node.input[0]]
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        if src.data_type != TensorProto.FLOAT16 or to != TensorProto.FLOAT:
            continue
        folded[node.output[0]] = numpy_helper.from_array(numpy_helper.to_array(src).astype(np.float32), node.output[0])
        consumers[src.name] -= 1
        drop_nodes.add(i)
    if not folded:
        return out
    remaining = [n for i, n in enumerate(graph.node) if i not in drop_nodes]
    kept = [i for i in graph.initializer if not (i.data_type == TensorProto.FLOAT16 and consumers.get(i.name, 0) == 0)]
    del graph.node[:]
    graph.node.extend(remaining)
    del graph.initializer[:]
    graph.initializer.extend(kept + list(folded.values()))
    _set_meta(out, {"weights_storage": "fp32"})
    return out


def weights_storage(model: onnx.ModelProto) -> str:
    """``"fp16"`` for a graph written by :func:`store_weights_fp16`, else ``"fp32"``."""
    return _get_meta(model).get("weights_storage", "fp32")


# -- recipes -----------------------------------------------------------------------------------
def recipe_for(name: str, card: ModelCard | None = None) -> dict[str, Any]:
    """The recipe of variant ``name``: the card's export.recipes entry, else the default."""
    recipes = (card.export.get("recipes") if card is not None else None) or {}
    recipe = recipes.get(name) or DEFAULT_RECIPES.get(name)
    if recipe is None:
        raise VariantError(f"unknown variant {name!r}; known variants: {', '.join(VARIANT_NAMES)}")
    return dict(recipe)


def recipe_chain(name: str, card: ModelCard | None = None) -> list[tuple[str, dict[str, Any]]]:
    """[(variant, recipe), ...] from the artifact to ``name`` (the artifact excluded)."""
    chain: list[tuple[str, dict[str, Any]]] = []
    seen: set[str] = set()
    current = name
    while current != "artifact":
        if current in seen:
            raise VariantError(f"variant recipes form a cycle through {current!r}")
        seen.add(current)
        recipe = recipe_for(current, card)
        chain.append((current, recipe))
        current = str(recipe.get("from", "artifact"))
    return chain[::-1]


def _recipe_key(chain: list[tuple[str, dict[str, Any]]]) -> str:
    return json.dumps({"version": RECIPE_VERSION, "chain": chain}, sort_keys=True, separators=(",", ":"))


def geometry_of(card: ModelCard | None) -> tuple[int, int]:
    """(num_heads, hidden_size) for the optimizer from the card; 0 lets it read them from the graph."""
    geometry = (card.export.get("geometry") if card is not None else None) or {}
    return int(geometry.get("num_attention_heads", 0)), int(geometry.get("hidden_size", 0))


# -- derivation --------------------------------------------------------------------------------
def derive(
    source: onnx.ModelProto, recipe: Mapping[str, Any], *, num_heads: int = 0, hidden_size: int = 0
) -> onnx.ModelProto:
    """Apply one recipe to an in-memory graph and return the derived graph (pure, deterministic)."""
    kind = recipe.get("kind")
    if kind == "fold_fp16_weights":
        return fold_fp16_weights(source)
    if kind == "ort_optimizer":
        return _optimize(source, recipe, num_heads, hidden_size)
    if kind == "quantize_dynamic":
        return _quantize(source, recipe)
    if kind == "float16":
        optimized = _optimize(source, {**recipe, "opt_level": 0}, num_heads, hidden_size)
        return _to_float16(optimized, recipe)
    raise VariantError(f"unknown recipe kind {kind!r} in {dict(recipe)}")


@contextlib.contextmanager
def quiet_loggers(*names: str) -> Iterator[None]:
    """Raise the named loggers to ERROR while the block runs, then restore their levels."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _quiet_onnxruntime_tools() -> contextlib.AbstractContextManager[None]:
    """Silence the optimizer's and quantizer's chatter while they run.

    onnxruntime.transformers puts its folder on sys.path, so its modules log under top-level
    names (``onnx_model_bert``...); the quantizer logs to the root logger.
    """
    import onnxruntime

    package = os.path.dirname(onnxruntime.__file__)
    names = {"", "onnxruntime"}
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(package):
            names.add(name)
    return quiet_loggers(*sorted(names))


def _optimize(model: onnx.ModelProto, recipe: Mapping[str, Any], num_heads: int, hidden_size: int) -> onnx.ModelProto:
    # imported here: onnxruntime.transformers puts its own folder on sys.path when imported
    from onnxruntime.transformers.optimizer import optimize_model

    with _quiet_onnxruntime_tools():
        optimizer = optimize_model(
            _copy(model),
            model_type=str(recipe.get("model_type", "bert")),
            num_heads=num_heads,
            hidden_size=hidden_size,
            opt_level=int(recipe.get("opt_level", 0)),
            use_gpu=bool(recipe.get("use_gpu", False)),
        )
    optimizer.topological_sort()
    fused = {k: v for k, v in optimizer.get_fused_operator_statistics().items() if v}
    if (
        recipe.get("model_type", "bert") == "bert"
        and not fused.get("Attention")
        and not fused.get("MultiHeadAttention")
    ):
        log.warning("the optimizer fused no attention in this graph: %s", fused)
    return _with_ms_domain(optimizer.model)


def _with_ms_domain(model: onnx.ModelProto) -> onnx.ModelProto:
    """Declare the com.microsoft opset when fused contrib ops are present (as OnnxModel.save does)."""
    uses_ms = any(node.domain == "com.microsoft" for node in model.graph.node)
    if uses_ms and not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def _quantize(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> onnx.ModelProto:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    weight_type = getattr(QuantType, str(recipe.get("weight_type", "QInt8")))
    patterns = [re.compile(p) for p in recipe.get("exclude_patterns") or []]
    excluded = [n.name for n in model.graph.node if n.name and any(p.search(n.name) for p in patterns)]
    if patterns and not excluded:
        log.warning("int8 recipe: exclude_patterns %s match no node; quantising everything", recipe["exclude_patterns"])
    with tempfile.TemporaryDirectory(prefix="dialogue-safety-int8-") as tmp, _quiet_onnxruntime_tools():
        src, dst = Path(tmp) / "in.onnx", Path(tmp) / "out.onnx"
        onnx.save(model, str(src))
        quantize_dynamic(
            src,
            dst,
            op_types_to_quantize=list(recipe.get("op_types") or []) or None,
            per_channel=bool(recipe.get("per_channel", False)),
            reduce_range=bool(recipe.get("reduce_range", False)),
            weight_type=weight_type,
            nodes_to_exclude=excluded or None,
            # fused contrib ops (Attention, SkipLayerNormalization) defeat onnx shape inference
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
        return onnx.load(str(dst))


def _to_float16(model: onnx.ModelProto, recipe: Mapping[str, Any]) -> onnx.ModelProto:
    from onnxruntime.transformers.onnx_model import OnnxModel

    wrapped = OnnxModel(model)
    with _quiet_onnxruntime_tools():
        wrapped.convert_float_to_float16(keep_io_types=bool(recipe.get("keep_io_types", True)))
    wrapped.topological_sort()
    return _with_ms_domain(wrapped.model)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


# -- metadata stamps ---------------------------------------------------------------------------
def _set_meta(model: onnx.ModelProto, values: Mapping[str, str]) -> None:
    existing = {p.key: p for p in model.metadata_props}
    for key, value in values.items():
        full = META + key
        if full in existing:
            existing[full].value = value
        else:
            prop = model.metadata_props.add()
            prop.key, prop.value = full, value


def _get_meta(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key[len(META) :]: p.value for p in model.metadata_props if p.key.startswith(META)}


def read_stamp(path: str | Path) -> dict[str, str]:
    """The ``dialogue_safety.*`` metadata of an ONNX file (variant, artifact_sha256, recipe...)."""
    return _get_meta(onnx.load(str(path), load_external_data=False))


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_atomic(model: onnx.ModelProto, path: str | Path) -> Path:
    """Write to a temporary file in the same folder, then rename: readers never see half a file."""
    dest = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        onnx.save(model, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return dest


# -- the model directory -----------------------------------------------------------------------
def variant_file(name: str, card: ModelCard | None = None, artifact: str | Path | None = None) -> str:
    """File name of a variant inside the model directory.

    The card's ``variants`` map decides; without an entry, ``fp32`` is the artifact itself when
    the artifact (if given) stores fp32 weights, and the other variants get their default name.
    """
    if card is not None and card.variants.get(name):
        return card.variants[name]
    if name not in DEFAULT_FILES:
        raise VariantError(f"unknown variant {name!r}; known variants: {', '.join(VARIANT_NAMES)}")
    if name == "fp32" and artifact is not None and read_stamp(artifact).get("weights_storage", "fp32") == "fp32":
        return ARTIFACT_FILE
    return DEFAULT_FILES[name]


def cache_root() -> Path:
    """Where derived variants go when the model directory is read-only.

    ``$DIALOGUE_SAFETY_CACHE_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/dialogue-safety/variants``.
    """
    explicit = os.environ.get("DIALOGUE_SAFETY_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "dialogue-safety" / "variants"


@contextlib.contextmanager
def _lock(directory: Path) -> Iterator[None]:
    """An exclusive lock so that two processes starting together derive a variant once."""
    try:
        import fcntl
    except ImportError:  # not POSIX: atomic renames still keep every file whole
        yield
        return
    with open(directory / ".variants.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)


def ensure_variant(model_dir: str | Path, name: str, card: ModelCard | None = None, *, force: bool = False) -> Path:
    """Path of variant ``name`` of the model in ``model_dir``, deriving it (and its sources) if needed.

    ``fp32`` is the artifact itself when the artifact stores fp32 weights. A derived file is
    reused when its stamp matches the current artifact (sha256) and recipe chain; otherwise (or
    with ``force``) it is derived again. Derived files go into ``model_dir`` when it is
    writable, else into :func:`cache_root` ``/<artifact sha256 prefix>/``; valid derived files
    already in a read-only ``model_dir`` (e.g. baked into an image) are used as they are.
    """
    directory = Path(model_dir)
    card = card if card is not None else ModelCard.load(directory)
    artifact = directory / ARTIFACT_FILE
    if not artifact.is_file():
        raise VariantError(f"{directory}: no {ARTIFACT_FILE}; export a checkpoint with `dialogue-safety export`")
    if variant_file(name, card, artifact) == ARTIFACT_FILE:
        return artifact
    chain = recipe_chain(name, card)
    artifact_sha = file_sha256(artifact)
    out_dir = directory if _writable(directory) else cache_root() / artifact_sha[:16]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not _writable(out_dir):
            raise PermissionError(f"{out_dir} is not writable")
    except OSError as exc:
        raise VariantError(
            f"the {name} variant must be derived, but {directory} is read-only and the cache directory "
            f"{out_dir} cannot be written ({exc}): set DIALOGUE_SAFETY_CACHE_DIR to a writable directory, "
            f"make {directory} writable, or derive the variant in advance (see the Dockerfile)"
        ) from exc
    with _lock(out_dir):
        return _ensure_chain(directory, out_dir, card, chain, artifact_sha, force=force)


def ensure_variant_in_subprocess(model_dir: str | Path, name: str, card: ModelCard | None = None) -> Path:
    """:func:`ensure_variant` in a spawned child process when something may have to be derived:
    deriving loads and rewrites whole graphs (a first start peaked at ~790 MiB against ~310 MiB
    for later starts), and a long-running service would keep that memory."""
    directory = Path(model_dir)
    card = card if card is not None else ModelCard.load(directory)
    artifact = directory / ARTIFACT_FILE
    if artifact.is_file() and variant_file(name, card, artifact) == ARTIFACT_FILE:
        return artifact  # nothing to derive
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        path: Path = pool.submit(ensure_variant, directory, name, card).result()
    return path


def _ensure_chain(
    model_dir: Path,
    out_dir: Path,
    card: ModelCard,
    chain: list[tuple[str, dict[str, Any]]],
    artifact_sha: str,
    *,
    force: bool,
) -> Path:
    num_heads, hidden_size = geometry_of(card)
    artifact = model_dir / ARTIFACT_FILE
    if not force:  # the variant itself is there and valid: its intermediates are not needed (pruned images)
        final = variant_file(chain[-1][0], card, artifact)
        found = _valid_existing([out_dir / final, model_dir / final], artifact_sha, _recipe_key(chain))
        if found is not None:
            return found
    source: onnx.ModelProto | None = None  # the previous step's graph when it was derived here
    source_path = artifact
    for depth, (name, recipe) in enumerate(chain):
        filename = variant_file(name, card, artifact)
        if filename == ARTIFACT_FILE:
            source, source_path = None, artifact
            continue
        key = _recipe_key(chain[: depth + 1])
        last = depth == len(chain) - 1
        if not (force and last):
            found = _valid_existing([out_dir / filename, model_dir / filename], artifact_sha, key)
            if found is not None:
                source, source_path = None, found
                continue
        graph = source if source is not None else _load(source_path)
        if recipe.get("kind") == "fold_fp16_weights" and weights_storage(graph) != "fp16":
            derived = _copy(graph)  # an fp32 artifact: nothing to fold
        else:
            log.info("deriving the %s variant of %s", name, model_dir)
            derived = derive(graph, recipe, num_heads=num_heads, hidden_size=hidden_size)
        _set_meta(
            derived, {"variant": name, "artifact_sha256": artifact_sha, "recipe": key, "onnxruntime": _ort_version()}
        )
        source, source_path = derived, save_atomic(derived, out_dir / filename)
    return source_path


def _load(path: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(path))
    except Exception as exc:  # protobuf DecodeError and friends
        raise VariantError(f"{path}: not a readable ONNX graph ({type(exc).__name__}: {exc})") from exc


def _valid_existing(candidates: list[Path], artifact_sha: str, key: str) -> Path | None:
    for path in candidates:
        if not path.is_file():
            continue
        try:
            stamp = read_stamp(path)
        except Exception as exc:  # a damaged file: derive it again
            log.warning("%s is unreadable (%s): deriving it again", path, exc)
            continue
        if stamp.get("artifact_sha256") == artifact_sha and stamp.get("recipe") == key:
            return path
        log.info("%s is stale (the artifact or the recipe changed): deriving it again", path)
    return None


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def derive_all(
    model_dir: str | Path, names: tuple[str, ...] | list[str] = VARIANT_NAMES, card: ModelCard | None = None
) -> dict[str, Path]:
    """Derive (or reuse) several variants; returns {name: path}."""
    directory = Path(model_dir)
    card = card if card is not None else ModelCard.load(directory)
    return {name: ensure_variant(directory, name, card) for name in names}


def prune(model_dir: str | Path, keep: dict[str, Path], card: ModelCard | None = None) -> list[Path]:
    """Remove the derived files (and the lock file) of ``model_dir`` that are not in ``keep``; returns them."""
    directory = Path(model_dir)
    card = card if card is not None else ModelCard.load(directory)
    kept = {p.resolve() for p in keep.values()}
    artifact = directory / ARTIFACT_FILE
    derived = {variant_file(name, card, artifact) for name in VARIANT_NAMES} - {ARTIFACT_FILE}
    removed = [
        directory / f for f in sorted(derived) if (directory / f).is_file() and (directory / f).resolve() not in kept
    ]
    removed += [p for p in [directory / ".variants.lock"] if p.is_file()]
    for path in removed:
        path.unlink()
    return removed


def main(argv: list[str] | None = None) -> int:
    """``python -m service.variants MODEL_DIR [VARIANT ...]``: derive variants ahead of time (Docker build)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m service.variants", description=main.__doc__)
    p.add_argument("model_dir", type=Path)
    p.add_argument(
        "variants",
        nargs="*",
        default=["fp32", "optimized", "int8"],
        help="variant names, or cpu / gpu for the model card's default on that device (default: the CPU variants)",
    )
    p.add_argument(
        "--prune",
        action="store_true",
        help="then remove every other derived file (intermediates too): an image ships one",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        card = ModelCard.load(args.model_dir)
        defaults = {"cpu": card.cpu_variant, "gpu": card.gpu_variant}
        names = [defaults.get(name, name) for name in args.variants]
        derived = derive_all(args.model_dir, names, card)
        for name, path in derived.items():
            print(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB)")
        if args.prune:
            for path in prune(args.model_dir, derived, card):
                print(f"removed {path}")
    except (VariantError, FileNotFoundError, ValueError) as exc:
        print(f"python -m service.variants: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
