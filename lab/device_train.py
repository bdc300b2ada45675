"""Train a recipe on a lent GPU machine in one prepared run, and bring the weights home.

The device machine sees only the repository's working tree plus up to 64 MiB of carried, git-ignored
files, has no registry to install from, and gives back at most 8 files of 16 MiB each. So:

``prepare`` (here) writes the carried folder (default ``.device/``, git-ignored):
    ``base/``         the recipe's base encoder with its weights rounded to fp16 (half the size);
    ``data.tar.xz``   exactly the data files the recipe's loaders open (found by watching them load), the
                      gzip layer removed for a tighter xz and restored on the device (``gz-list.txt``);
    ``whl/``          wheels of the training dependencies the device image lacks (for its Python 3.12);
    ``manifest.json`` what was prepared, from which recipe and base.
  It prints the size that will travel (the tracked tree counts too) and what to do when it is over.
``lab/device_train.sh`` (there) installs the wheels, restores the fp32 base and the data, trains the recipe
  on the GPU end to end (validation checks, keep-best, calibration, card) under a time limit, and runs
``pack`` (there): the weights as fp32 shards under 15 MiB each, without the frozen word embeddings
  (rebuilt exactly at home from the same fp16-rounded base), plus the run's card, config and metrics;
  an interrupted run packs its best validation check (``best_model.pt``) instead.
``unpack`` (here): a training checkpoint directory rebuilt from those files, ready for ``dialogue-safety
  export``; it refuses when the word embeddings were not frozen (they would not be the base's).

::

    python -m lab.device_train prepare --config default --data-dir ../shared/data
    # device run, carrying .device:  lab/device_train.sh $OUT 540 --set eval_batch_tokens=65536
    python -m lab.device_train unpack /work/.device/... checkpoints/default-gpu
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dialogue_safety.core.model_dir import CARD_FILE, CHECKPOINT_CONFIG_FILE, CHECKPOINT_FILES

REPO = Path(__file__).resolve().parents[1]
WEIGHTS_FILE = CHECKPOINT_FILES[1]  # a Hugging Face directory's weights: the base's and a checkpoint's
CARRY = Path(".device")
MANIFEST = "manifest.json"
BASE_DIR = "base"
DATA_ARCHIVE = "data.tar.xz"
GZ_LIST = "gz-list.txt"
WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"  # in the classifier; the base may lack "bert."
SHARD_BYTES = 15 * 2**20
TRAVEL_LIMIT = 64 * 2**20
#: what training imports that the device image (PyTorch, transformers, tokenizers, safetensors, numpy,
#: scikit-learn, SciPy, tqdm) does not hold; carried as wheels at the versions installed here
DEVICE_WHEELS = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "emoji")
DEVICE_PLATFORM = (
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *(
        p
        for tag in ("manylinux_2_28", "manylinux_2_27", "manylinux_2_17", "manylinux2014")
        for p in ("--platform", f"{tag}_x86_64")
    ),
)


# -- prepare (here) ---------------------------------------------------------------------------------


@contextmanager
def files_opened_under(root: Path) -> Iterator[set[Path]]:
    """The files under ``root`` that the code in the block opens (an audit hook; hooks cannot be removed,
    so this one goes quiet when the block ends)."""
    seen: set[Path] = set()
    top = os.path.realpath(root)
    active = [True]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if active[0] and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.path.realpath(os.fsdecode(args[0]))
            if path.startswith(top + os.sep):
                seen.add(Path(path))

    sys.addaudithook(hook)
    try:
        yield seen
    finally:
        active[0] = False


def recipe_data_files(recipe: Any, data_dir: Path) -> list[Path]:
    """Every file the recipe's training run reads from ``data_dir`` (its tasks, its evaluation sources, the
    licences), relative to ``data_dir``, plus every small file there (provenance notes, format samples: what
    the registry looks at to decide that a source is absent or sample-only)."""
    from dialogue_safety.sources import registry
    from dialogue_safety.training.tasks import load_task_data

    with files_opened_under(data_dir) as opened:
        load_task_data(recipe, data_dir)
        for name in recipe.eval_sources:
            registry.load_source(name, data_dir)
        registry.available_sources(data_dir)
    small = {p for p in data_dir.rglob("*") if p.is_file() and p.stat().st_size < 100_000}
    top = Path(os.path.realpath(data_dir))
    return sorted({p.relative_to(top) for p in opened} | {Path(os.path.realpath(p)).relative_to(top) for p in small})


def pack_data(data_dir: Path, files: Sequence[Path], archive: Path) -> None:
    """``files`` (relative to ``data_dir``) into an xz tar under ``data/``, gzip layers removed and listed."""
    import gzip

    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        gz: list[str] = []
        for rel in files:
            src, dst = data_dir / rel, stage / "data" / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if rel.suffix == ".gz":
                with gzip.open(src, "rb") as fin, open(dst.with_suffix(""), "wb") as fout:
                    shutil.copyfileobj(fin, fout)
                gz.append(str(Path("data") / rel.with_suffix("")))
            else:
                shutil.copy2(src, dst)
        (stage / GZ_LIST).write_text("".join(f"{g}\n" for g in gz))
        with tarfile.open(archive, "w:xz", preset=9) as tar:
            tar.add(stage / "data", arcname="data")
            tar.add(stage / GZ_LIST, arcname=GZ_LIST)


def pack_base(base_dir: Path, out: Path) -> None:
    """The base encoder's directory with its floating-point weights rounded to fp16."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for item in base_dir.iterdir():
        if item.name == WEIGHTS_FILE or item.name.startswith(("__", ".")):
            continue
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, out / item.name)
    weights = load_file(str(base_dir / WEIGHTS_FILE))
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    save_file(half, str(out / WEIGHTS_FILE), metadata={"format": "pt"})


def download_wheels(out: Path) -> list[str]:
    """The device's missing dependencies as wheels for its Python, at the versions installed here."""
    from importlib.metadata import version

    out.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={version(name)}" for name in DEVICE_WHEELS]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *DEVICE_PLATFORM, "-d", str(out), *pins]
    subprocess.run(cmd, check=True)
    return pins


def tracked_bytes(repo: Path) -> int:
    """What git's tracked and untracked-not-ignored files weigh: they travel with every device call."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum((repo / os.fsdecode(p)).stat().st_size for p in listed if p and (repo / os.fsdecode(p)).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def prepare(config: str, overrides: list[str], data_dir: Path, out: Path, wheels: bool = True) -> dict[str, Any]:
    from dialogue_safety.training.modeling import MINILM, resolve_base
    from dialogue_safety.training.recipe import load_recipe

    recipe = load_recipe(config, overrides)
    base = resolve_base(recipe.base)
    if not isinstance(base, Path):
        raise SystemExit(f"{recipe.base}: a random base needs no device run")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    files = recipe_data_files(recipe, data_dir)
    pack_data(data_dir, files, out / DATA_ARCHIVE)
    pack_base(base, out / BASE_DIR)
    pins = download_wheels(out / "whl") if wheels else []
    manifest = {
        "config": config,
        "overrides": overrides,
        "base": recipe.base,
        "base_is_package": recipe.base == MINILM,
        "data_files": [str(f) for f in files],
        "wheels": pins,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def base_word_embeddings(base_weights: Path) -> Any:
    """The word embeddings of a base's weights file (saved with or without the ``bert.`` prefix)."""
    from safetensors.torch import load_file

    weights = load_file(str(base_weights))
    (name,) = [k for k in weights if k.removeprefix("bert.") == WORD_EMBEDDINGS.removeprefix("bert.")]
    return weights[name].float()


def restore_base(carried: Path, out: Path) -> None:
    """(On the device) the carried base at fp32 again: the values the packed word embeddings are compared with."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(carried, out)
    weights = load_file(str(carried / WEIGHTS_FILE))
    full = {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    save_file(full, str(out / WEIGHTS_FILE), metadata={"format": "pt"})


# -- pack (on the device) ---------------------------------------------------------------------------


def _run_weights(run: Path) -> tuple[dict[str, Any], str]:
    import torch
    from safetensors.torch import load_file

    from dialogue_safety.training.run_dir import BEST_FILE, LAST_DIR

    if (run / WEIGHTS_FILE).is_file():
        return load_file(str(run / WEIGHTS_FILE)), "final"
    if (run / BEST_FILE).is_file():
        return torch.load(run / BEST_FILE, map_location="cpu"), "best"
    if (run / LAST_DIR / WEIGHTS_FILE).is_file():
        return load_file(str(run / LAST_DIR / WEIGHTS_FILE)), "last"
    raise SystemExit(f"{run}: no weights to pack (model.safetensors, best_model.pt or last/)")


def pack(run: Path, out: Path, base_weights: Path) -> dict[str, Any]:
    """The run's weights as fp32 shards of at most ``SHARD_BYTES``, the word embeddings left out when they
    are the base's fp16-rounded ones (frozen), and its card, config and metrics beside them."""
    from safetensors.torch import save_file

    state, kind = _run_weights(run)
    state = {k: v.detach().cpu().contiguous() for k, v in state.items()}
    base_words = base_word_embeddings(base_weights)
    words = state[WORD_EMBEDDINGS].float()
    frozen = words.shape == base_words.shape and bool((words == base_words).all())
    rest = {k: v for k, v in state.items() if k != WORD_EMBEDDINGS or not frozen}
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, tensor in rest.items():
        n = tensor.numel() * tensor.element_size()
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += n
    out.mkdir(parents=True, exist_ok=True)
    for i, shard in enumerate(shards):
        save_file(shard, str(out / f"shard{i}.safetensors"), metadata={"format": "pt", "kind": kind})
    from dialogue_safety.training.run_dir import LAST_DIR, METRICS_FILE

    for name in (METRICS_FILE, CARD_FILE, CHECKPOINT_CONFIG_FILE):
        for src in (run / name, run / LAST_DIR / name):
            if src.is_file():
                shutil.copy2(src, out / name)
                break
    summary = {"kind": kind, "shards": len(shards), "word_embeddings_frozen": frozen, "tensors": len(state)}
    print("packed " + json.dumps(summary))
    return summary


# -- unpack (here) ----------------------------------------------------------------------------------


def unpack(files: Path, out: Path, carry: Path) -> Path:
    """A training checkpoint (config, weights, tokenizer, card, metrics) from a device run's files."""
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertForSequenceClassification

    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.training.checkpoint import save_checkpoint
    from dialogue_safety.training.modeling import load_base_tokenizer
    from dialogue_safety.training.run_dir import METRICS_FILE

    manifest = json.loads((carry / MANIFEST).read_text())
    shards = sorted(files.glob("shard*.safetensors"), key=lambda p: int(p.stem.removeprefix("shard")))
    if not shards:
        raise SystemExit(f"{files}: no shard*.safetensors")
    missing = [n for n in (CHECKPOINT_CONFIG_FILE, CARD_FILE) if not (files / n).is_file()]
    if missing:
        raise SystemExit(f"{files}: missing {', '.join(missing)} (the run did not finish: train on from here)")
    state: dict[str, torch.Tensor] = {}
    for shard in shards:
        state.update(load_file(str(shard)))
    if WORD_EMBEDDINGS not in state:
        state[WORD_EMBEDDINGS] = base_word_embeddings(carry / BASE_DIR / WEIGHTS_FILE)
    card = ModelCard.load(files)
    if not manifest["base_is_package"]:
        card.base_model = manifest["base"]
        card.training.setdefault("recipe", {})["base"] = manifest["base"]
    tokenizer = load_base_tokenizer(manifest["base"], card.training.get("recipe", {}).get("vocab_file"))
    model = BertForSequenceClassification(BertConfig.from_json_file(str(files / CHECKPOINT_CONFIG_FILE)))
    model.load_state_dict(state)
    save_checkpoint(out, model, tokenizer, card)
    if (files / METRICS_FILE).is_file():
        shutil.copy2(files / METRICS_FILE, out / METRICS_FILE)
    return out


# -- the command ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.device_train", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="write the carried folder for a device run of a recipe")
    p.add_argument("--config", default="default")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--data-dir", type=Path, default=Path("../shared/data"))
    p.add_argument("--out", type=Path, default=CARRY)
    p.add_argument("--no-wheels", action="store_true", help="carry no wheels (a device image that holds them)")
    r = sub.add_parser("restore-base", help="(on the device) the carried base at fp32 in a directory")
    r.add_argument("out", type=Path)
    r.add_argument("--carry", type=Path, default=CARRY)
    k = sub.add_parser("pack", help="(on the device) a finished or interrupted run's weights, in shards")
    k.add_argument("run", type=Path)
    k.add_argument("out", type=Path)
    k.add_argument("--base-weights", type=Path, default=CARRY / BASE_DIR / WEIGHTS_FILE)
    u = sub.add_parser("unpack", help="a training checkpoint from a device run's files")
    u.add_argument("files", type=Path)
    u.add_argument("out", type=Path)
    u.add_argument("--carry", type=Path, default=CARRY)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        manifest = prepare(args.config, args.overrides, args.data_dir, args.out, wheels=not args.no_wheels)
        carried, tracked = folder_bytes(args.out), tracked_bytes(REPO)
        print(
            f"{args.out}: {carried / 2**20:.1f} MiB ({len(manifest['data_files'])} data files, "
            f"{len(manifest['wheels'])} wheels); the tracked tree adds {tracked / 2**20:.1f} MiB; "
            f"the limit is {TRAVEL_LIMIT / 2**20:.0f} MiB"
        )
        if carried + tracked > TRAVEL_LIMIT:
            print(
                "over the limit: keep the largest tracked files from travelling for the one call (for the "
                "bundled model: git rm --cached -q models/default/model.onnx && echo /models/default/model.onnx "
                ">> .git/info/exclude; afterwards git reset -q -- models/default/model.onnx and remove that "
                "line from .git/info/exclude)"
            )
    elif args.command == "restore-base":
        restore_base(args.carry / BASE_DIR, args.out)
    elif args.command == "pack":
        pack(args.run, args.out, args.base_weights)
    else:
        print(f"wrote {unpack(args.files, args.out, args.carry)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
