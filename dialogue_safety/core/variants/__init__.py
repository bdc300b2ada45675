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
the artifact's sha256, the recipe and the onnxruntime version (ONNX ``metadata_props``): a derived
file whose stamp does not match the current artifact, recipe or onnxruntime is derived again. The
derived files hold no CPU-specific code (the CPU decides at each start which variant is served:
``dialogue_safety.core.runtime.int8_supported``), so the CPU is not part of the key. What the files
say is indexed by size, mtime and inode (:mod:`.stamps`), so a later start reads no graph to check them.

This package: the variants, their recipes and their derivation (here); the graph transforms
(:mod:`.graphs`); the stamps and atomic writes (:mod:`.stamps`); the cache directory and the
lock (:mod:`.cache`); ``python -m dialogue_safety.core.variants`` (:mod:`.cli`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import onnx

from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.model_dir import (
    ARTIFACT_FILE,
    CALIBRATION_FILE,
    STAMP_INDEX_FILE,
    VARIANT_FILES,
    VARIANT_LOCK_FILE,
)
from dialogue_safety.core.variants import cache as variant_cache
from dialogue_safety.core.variants import rewrites
from dialogue_safety.core.variants.graphs import (
    copy_model,
    fold_fp16_weights,
    optimize,
    quantize,
    quantize_matmul_nbits,
    quantize_static_qdq,
    saturate_outlier_masks,
    split_channels_of,
    split_outlier_channels,
    to_float16,
    weights_storage,
)
from dialogue_safety.core.variants.stamps import file_sha256, read_stamp, save_atomic, set_meta

log = logging.getLogger("dialogue_safety.core.variants")


VARIANT_NAMES: tuple[str, ...] = ("fp32", "optimized", "int8", "fp16")
RECIPE_VERSION = 1

# int8 recipes (their measurements: lab/notes/runtime.md, "int8 recipes (measured)"): quantising every MatMul
# is the fastest and moves the most decisions; quantising only the attention projections moves fewer for a
# smaller speed-up. Node names are those of torch.onnx's export of Hugging Face BERT.
FFN_UP = r"intermediate/dense/MatMul$"
FFN_DOWN = r"layer\.\d+/output/dense/MatMul$"
#: the int8 presets the product can select: the export's candidates (:data:`INT8_CANDIDATES`) and the default
#: recipe's "all"; the research presets (Percentile/Entropy calibration, outlier splits of every layer, ...)
#: live in the repository's lab (lab/int8_presets.py), outside the package
INT8_PRESETS: dict[str, dict[str, Any]] = {
    "all": {
        "kind": "quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "reduce_range": True,  # 7-bit weights: no u8*s8 saturation on AVX2 CPUs without VNNI
        "op_types": ["MatMul", "Attention"],  # embeddings stay fp32
    },
}
# Calibrated static int8 (QDQ) from the plain fp32 graph (QDQ cannot quantise the optimizer's fused
# Attention): per-channel int8 weights, uint8 activations with ranges fixed from the model
# directory's calibration rows (core/variants/calibration.py), MatMul outputs and the residual
# stream in fp32, the attention score products (QK^T, softmax x V) in fp32. ``from`` is part of
# the preset: these start from fp32, the dynamic ones from the optimized graph.
ATTENTION_SCORES = r"attention/self/MatMul(_1)?$"
_STATIC: dict[str, Any] = {
    "from": "fp32",
    "kind": "quantize_static",
    "calibrate_method": "MinMax",
    "weight_type": "QInt8",
    "activation_type": "QUInt8",
    "per_channel": True,
    "reduce_range": False,  # 8-bit weights: needs VNNI on x86 (dialogue_safety.core.runtime.int8_supported)
    "op_types": ["MatMul"],
    "exclude_patterns": [ATTENTION_SCORES],
    "fp32_residual": True,
    # then how onnxruntime's CPU kernels compute it (core/variants/rewrites.py): each layer's bias inside its
    # integer MatMul, no SkipLayerNormalization, K^T by whole heads
    "rewrites": list(rewrites.REWRITES),
}
# "static" with the 8 widest input channels of each feed-forward layer (from the calibration rows) computed
# apart in fp32 (graphs.split_outlier_channels): their wide ranges no longer set the fixed activation scales
# (closer to fp32's scores, a little slower than "static": lab/notes/runtime.md)
_STATIC_SPLIT: dict[str, Any] = {**_STATIC, "outlier_channels": 8, "outlier_patterns": [FFN_UP, FFN_DOWN]}
# "static-split", cheaper: only the feed-forward inputs whose widest channel reaches twice the 9th widest are
# split, and the mask goes once the scales are
# fixed (those channels meet zeroed weight rows, so the product is the same: graphs.saturate_outlier_masks)
#: how the masked product of a split reads its input: through the mask Mul, or unmasked once the scales are fixed
OUTLIER_MASKS: tuple[str, ...] = ("mul", "saturate")
_STATIC_SPLIT_LEAN: dict[str, Any] = {**_STATIC_SPLIT, "outlier_min_ratio": 2.0, "outlier_mask": "saturate"}
INT8_PRESETS.update(
    {
        # blockwise int8 (MatMulNBits, 8-bit weights in blocks of 128 along the input dimension,
        # accuracy_level 4: activations quantised per row and block, int8 products) on the optimized
        # graph (the fused Attention stays fp32): the one recipe that kept >= 99 % of 0.4.0's
        # decisions on every validation split (lab/notes/runtime.md); no calibration needed
        "nbits8": {
            "from": "optimized",
            "kind": "matmul_nbits",
            "bits": 8,
            "block_size": 128,
            "accuracy_level": 4,
            "op_types": ["MatMul"],
            "reduce_range": False,  # 8-bit weights: served on x86 only with VNNI (runtime.int8_supported)
        },
        "static": dict(_STATIC),
        "static-split-lean": dict(_STATIC_SPLIT_LEAN),
        # the same with 7-bit weights: u8 x s7 products cannot saturate AVX2's 16-bit pairs, so it computes the
        # same on x86 CPUs without VNNI (and on ARM) as where it was validated (runtime.int8_supported)
        "static-split-lean-7bit": {**_STATIC_SPLIT_LEAN, "reduce_range": True},
    }
)
INT8_PRESETS.update(
    {
        # dynamic int8 on the plain fp32 graph: per-channel 8-bit weights, per-tensor uint8 activations
        # quantised at run time, the 36 linear layers (and the pooler/classifier) only. onnxruntime fuses
        # the graph itself at load (DynamicQuantizeMatMul, MatMulIntegerToFloat, unfused attention), faster
        # than the same quantisation of the optimizer's graph (QAttention): as fast as a naive
        # quantize_dynamic, but per-channel. Its activation scales are taken over the whole batch,
        # so a dialogue's score moves with the traffic it is batched with: the export
        # refuses it for that (dialogue_safety.export.quantization.batch_dependence)
        "dynamic": {
            "from": "fp32",
            "kind": "quantize_dynamic",
            "weight_type": "QInt8",
            "per_channel": True,
            "reduce_range": False,  # 8-bit weights: served on x86 only with VNNI (runtime.int8_supported)
            "op_types": ["MatMul"],
        },
    }
)


#: a recipe's record of the channels its split computes apart ({MatMul name: indices}), written by the export
#: from the variant it derived and validated (:func:`record_outlier_choice`): a first start then splits those
#: channels without running the graph over the calibration rows to find them again (a third of the derivation)
OUTLIER_CHOICE = "outlier_channel_indices"


def record_outlier_choice(model_dir: str | Path, name: str, card: ModelCard) -> bool:
    """Record in ``card``'s recipe of variant ``name`` the outlier channels its derived file split (in
    place; the caller saves the card), and stamp that file with the recipe as recorded (the same graph:
    deriving it with the record splits the same channels). False when the recipe splits none."""
    recipes = card.export.get("recipes") or {}
    recipe = recipes.get(name)
    if not recipe or not recipe.get("outlier_channels") or OUTLIER_CHOICE in recipe:
        return False
    path = ensure_variant(model_dir, name, card)
    graph = onnx.load(str(path))
    recipe[OUTLIER_CHOICE] = split_channels_of(graph)
    set_meta(graph, {"recipe": _recipe_key(recipe_chain(name, card))})
    save_atomic(graph, path)
    return True


def needs_calibration(recipe: Mapping[str, Any]) -> bool:
    """Whether deriving ``recipe`` reads the model directory's calibration rows."""
    return recipe.get("kind") == "quantize_static" or bool(recipe.get("outlier_channels"))


#: the int8 recipes `dialogue-safety export` judges (0.4.0, 2 threads, model only, sorted batches of 64 against
#: the fp32 graph: dynamic 2.2x, static 2.35x and static-split-lean 2.0x with the CPU kernel rewrites (1.8x and
#: 1.6x without), nbits8 1.0x); of those that pass the gate
#: on the validation splits, alone or with the fp32 check of the dialogues scored near the threshold, and whose
#: scores do not move with the batch (dynamic per-tensor scales do), the cheapest to serve, check included,
#: becomes the int8 variant (dialogue_safety.export.quantization.select_int8_recipe): static-split-lean keeps the
#: verdicts with a narrower band (its largest score error is about half of static's), static checks more
#: dialogues with fp32. The lab's Percentile/Entropy presets are not candidates: their histogram calibration holds
#: every activation of the padded calibration rows in memory (~12 GB for MiniLM-L6).
#: static-split-lean-7bit is the portable one (7-bit weights: the same on x86 without VNNI, where an 8-bit recipe is
#: not served): preferred unless an 8-bit candidate is clearly cheaper (export.quantization.PORTABLE_MARGIN).
INT8_CANDIDATES: tuple[str, ...] = ("dynamic", "static-split-lean", "static-split-lean-7bit", "static", "nbits8")

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
    source: onnx.ModelProto,
    recipe: Mapping[str, Any],
    *,
    num_heads: int = 0,
    hidden_size: int = 0,
    calibration: str | Path | None = None,
) -> onnx.ModelProto:
    """Apply one recipe to an in-memory graph and return the derived graph (pure, deterministic).

    ``calibration`` is the model directory's calibration file, which a ``quantize_static`` recipe
    reads (its sha256 must be the one the recipe was validated with, when the recipe records one).
    """
    kind = recipe.get("kind")
    if recipe.get("outlier_mask", "mul") not in OUTLIER_MASKS:
        raise VariantError(f"outlier_mask must be one of {', '.join(OUTLIER_MASKS)}: {dict(recipe)}")
    saturate = recipe.get("outlier_mask") == "saturate"
    if saturate and kind != "quantize_static":
        raise VariantError(f"outlier_mask 'saturate' needs fixed activation scales (quantize_static): {dict(recipe)}")
    feeds = _calibration_feeds(recipe, calibration) if needs_calibration(recipe) else []
    if recipe.get("outlier_channels"):  # before either quantiser: those channels stay out of the int8 products
        source, _ = _split(source, recipe, feeds, saturate)
    derived = _derive_kind(source, recipe, feeds, num_heads, hidden_size)
    if recipe.get("rewrites"):  # how onnxruntime's CPU kernels compute it, not what (core/variants/rewrites.py)
        derived = copy_model(derived) if derived is source else derived
        try:
            counts = rewrites.apply(derived, list(recipe["rewrites"]))
        except ValueError as exc:
            raise VariantError(f"{exc} (recipe {dict(recipe)})") from exc
        log.debug("graph rewrites: %s", counts)
    return derived


def _split(
    source: onnx.ModelProto, recipe: Mapping[str, Any], feeds: list[dict[str, Any]], saturate: bool
) -> tuple[onnx.ModelProto, int]:
    try:
        return split_outlier_channels(
            source,
            feeds,
            tuple(recipe.get("outlier_patterns") or ()),
            int(recipe["outlier_channels"]),
            min_ratio=float(recipe.get("outlier_min_ratio", 0.0)),
            zero_rows=saturate,
            chosen=recipe.get(OUTLIER_CHOICE),
        )
    except ValueError as exc:
        raise VariantError(f"{exc} (recipe preset {recipe.get('preset', '?')})") from exc


def _derive_kind(
    source: onnx.ModelProto,
    recipe: Mapping[str, Any],
    feeds: list[dict[str, Any]],
    num_heads: int,
    hidden_size: int,
) -> onnx.ModelProto:
    kind = recipe.get("kind")
    if kind == "quantize_static":
        quantized = quantize_static_qdq(source, recipe, feeds)
        if recipe.get("outlier_mask") == "saturate":
            try:
                saturate_outlier_masks(quantized)
            except ValueError as exc:
                raise VariantError(f"{exc} (recipe {dict(recipe)})") from exc
        return quantized
    if kind == "matmul_nbits":
        return quantize_matmul_nbits(source, recipe)
    if kind == "fold_fp16_weights":
        return fold_fp16_weights(source)
    if kind == "ort_optimizer":
        return optimize(source, recipe, num_heads, hidden_size)
    if kind == "quantize_dynamic":
        return quantize(source, recipe)
    if kind == "float16":
        optimized = optimize(source, {**recipe, "opt_level": 0}, num_heads, hidden_size)
        return to_float16(optimized, recipe)
    raise VariantError(f"unknown recipe kind {kind!r} in {dict(recipe)}")


def _calibration_feeds(recipe: Mapping[str, Any], calibration: str | Path | None) -> list[dict[str, Any]]:
    from dialogue_safety.core.variants.calibration import calibration_feeds

    if calibration is None:
        raise VariantError(f"the recipe {dict(recipe)} needs the model directory's {CALIBRATION_FILE}")
    expected = recipe.get("calibration_sha256")
    if expected and Path(calibration).is_file() and file_sha256(calibration) != expected:
        raise VariantError(
            f"{calibration} is not the calibration set the int8 recipe was validated with (sha256 "
            f"{file_sha256(calibration)[:12]}… != {str(expected)[:12]}…): re-export the model"
        )
    try:
        return calibration_feeds(calibration)
    except ValueError as exc:
        raise VariantError(str(exc)) from exc


# -- the model directory -----------------------------------------------------------------------
def variant_file(name: str, card: ModelCard | None = None, artifact: str | Path | None = None) -> str:
    """File name of a variant inside the model directory.

    The card's ``variants`` map decides; without an entry, ``fp32`` is the artifact itself when
    the artifact (if given) stores fp32 weights, and the other variants get their default name.
    """
    if card is not None and card.variants.get(name):
        return card.variants[name]
    if name not in VARIANT_FILES:
        raise VariantError(f"unknown variant {name!r}; known variants: {', '.join(VARIANT_NAMES)}")
    if name == "fp32" and artifact is not None and read_stamp(artifact).get("weights_storage", "fp32") == "fp32":
        return ARTIFACT_FILE
    return VARIANT_FILES[name]


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
    out_dir = directory if variant_cache.writable(directory) else variant_cache.cache_root() / artifact_sha[:16]
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if not variant_cache.writable(out_dir):
            raise PermissionError(f"{out_dir} is not writable")
    except OSError as exc:
        raise VariantError(
            f"the {name} variant must be derived, but {directory} is read-only and the cache directory "
            f"{out_dir} cannot be written ({exc}): set DIALOGUE_SAFETY_CACHE_DIR to a writable directory, "
            f"make {directory} writable, or derive the variant in advance (see the Dockerfile)"
        ) from exc
    with variant_cache.lock(out_dir):
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
    if artifact.is_file():
        found = derived_path(directory, name, card)
        if found is not None:  # a later start: nothing to derive, no child process to start
            return found
        # said here (the child's log goes nowhere); the service shows it as the step /ready's 503 is in
        log.info(
            "building the %s variant of %s (first start with this model, recipe or onnxruntime version; "
            "later starts reuse it)",
            name,
            directory,
        )
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        path: Path = pool.submit(ensure_variant, directory, name, card).result()
    return path


def is_derived(model_dir: str | Path, name: str, card: ModelCard | None = None) -> bool:
    """True when variant ``name`` needs no deriving: the artifact itself, or a valid derived file in
    ``model_dir`` or the cache (what :func:`ensure_variant` would use as it is)."""
    directory = Path(model_dir)
    card = card if card is not None else ModelCard.load(directory)
    if variant_file(name, card, directory / ARTIFACT_FILE) == ARTIFACT_FILE:
        return True
    return derived_path(directory, name, card) is not None


def derived_path(model_dir: str | Path, name: str, card: ModelCard | None = None) -> Path | None:
    """The valid derived file of variant ``name`` in ``model_dir`` or the cache, or None (to derive)."""
    directory = Path(model_dir)
    card = card if card is not None else ModelCard.load(directory)
    artifact = directory / ARTIFACT_FILE
    final = variant_file(name, card, artifact)
    sha = file_sha256(artifact)
    candidates = [directory / final, variant_cache.cache_root() / sha[:16] / final]
    return _valid_existing(candidates, sha, _recipe_key(recipe_chain(name, card)))


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
            derived = copy_model(graph)  # an fp32 artifact: nothing to fold
        else:
            log.info("deriving the %s variant of %s", name, model_dir)
            derived = derive(
                graph, recipe, num_heads=num_heads, hidden_size=hidden_size, calibration=model_dir / CALIBRATION_FILE
            )
        set_meta(
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
        # the onnxruntime version is part of the key: its quantisation tools write the int8 graphs
        if stamp.get("artifact_sha256") == artifact_sha and stamp.get("recipe") == key:
            if stamp.get("onnxruntime") == _ort_version():
                return path
            log.info("%s was derived with onnxruntime %s: deriving it again", path, stamp.get("onnxruntime"))
            continue
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
    removed += [p for p in [directory / VARIANT_LOCK_FILE, directory / STAMP_INDEX_FILE] if p.is_file()]
    for path in removed:
        path.unlink()
    return removed
