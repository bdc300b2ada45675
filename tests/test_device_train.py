"""The device round trip of ``lab/device_train.py`` without a device: the carried data archive holds what the
recipe's loaders read (the same examples load from it), a run trained from the fp16-rounded base packs into
small shards without its frozen word embeddings, and ``unpack`` rebuilds exactly the trained weights as a
checkpoint that exports."""

from __future__ import annotations

import gzip
import json
import tarfile
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertModel

from dialogue_safety.cli.main import main as cli_main
from dialogue_safety.training.recipe import load_recipe
from dialogue_safety.training.tasks import load_task_data
from lab import device_train

FULL = Path(__file__).parent / "fixtures" / "sources" / "full"
VOCAB = Path(__file__).parent / "fixtures" / "tiny_vocab.txt"
SMALL = [
    "max_steps=6",
    "batch_size=8",
    "eval_every=3",
    "num_threads=1",
    "encoding.max_length=64",
    "encoding.max_utterance_tokens=32",
]


def _base(tmp: Path) -> Path:
    """A tiny BERT saved as a local Hugging Face directory (a base like the packaged MiniLM)."""
    vocab = VOCAB.read_text().split()
    config = BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    base = tmp / "base"
    BertModel(config).save_pretrained(base, safe_serialization=True)
    (base / "vocab.txt").write_text(VOCAB.read_text())
    return base


def test_prepare_train_pack_unpack_round_trip(tmp_path: Path) -> None:
    base = _base(tmp_path)
    overrides = [f"base={base}", *SMALL]
    carry = tmp_path / "carry"
    manifest = device_train.prepare("default", overrides, FULL, carry, wheels=False)
    assert manifest["base"] == str(base) and not manifest["base_is_package"]

    # the device's side: the data restored (gzip layers back), the base at fp32 again from its fp16 copy
    data = tmp_path / "device-data"
    with tarfile.open(carry / device_train.DATA_ARCHIVE) as tar:
        tar.extractall(data, filter="data")
    for name in (data / device_train.GZ_LIST).read_text().split():
        plain = data / name
        with open(plain, "rb") as fin, gzip.open(plain.with_name(plain.name + ".gz"), "wb") as fout:
            fout.write(fin.read())
        plain.unlink()
    recipe = load_recipe("default", overrides)
    home, _ = load_task_data(recipe, FULL)
    away, _ = load_task_data(recipe, data / "data")
    assert [(t.spec.name, len(t.train), len(t.valid), len(t.test)) for t in away] == [
        (t.spec.name, len(t.train), len(t.valid), len(t.test)) for t in home
    ]
    assert [ex.utterance for t in away for ex in t.train] == [ex.utterance for t in home for ex in t.train]
    half = load_file(str(carry / device_train.BASE_DIR / device_train.WEIGHTS_FILE))
    assert {v.dtype for v in half.values() if v.is_floating_point()} == {torch.float16}
    device_base = tmp_path / "device-base"
    device_train.restore_base(carry / device_train.BASE_DIR, device_base)
    run = tmp_path / "run"
    argv = ["train", "--config", "default", "--data-dir", str(data / "data"), "--out", str(run), "--no-progress"]
    sets = [a for o in [*SMALL, f"base={device_base}", "checkpoint_every=0"] for a in ("--set", o)]
    assert cli_main([*argv, *sets]) == 0

    files = tmp_path / "files"
    summary = device_train.pack(run, files, carry / device_train.BASE_DIR / device_train.WEIGHTS_FILE)
    assert summary["kind"] == "final" and summary["word_embeddings_frozen"] is True
    packed = {k for shard in files.glob("shard*.safetensors") for k in load_file(str(shard))}
    assert device_train.WORD_EMBEDDINGS not in packed
    assert all(p.stat().st_size <= 16 * 2**20 for p in files.iterdir())

    ckpt = device_train.unpack(files, tmp_path / "ckpt", carry)
    trained, rebuilt = load_file(str(run / "model.safetensors")), load_file(str(ckpt / "model.safetensors"))
    assert trained.keys() == rebuilt.keys()
    assert all(torch.equal(trained[k], rebuilt[k]) for k in trained)
    card = json.loads((ckpt / "model_card.json").read_text())
    assert card["base_model"] == str(base)  # the base as prepared, not the device's copy
    assert (ckpt / "metrics.jsonl").read_text() == (run / "metrics.jsonl").read_text()
    assert cli_main(["export", str(ckpt), str(tmp_path / "model"), "--no-eval", "--variants", "fp32", "-q"]) == 0


def test_an_interrupted_run_packs_its_best_check(tmp_path: Path) -> None:
    base = _base(tmp_path)
    carry = tmp_path / "carry"
    run = tmp_path / "run"
    run.mkdir()
    model = BertModel.from_pretrained(base)
    state = {f"bert.{k}": v.half().float() for k, v in model.state_dict().items()}
    state[device_train.WORD_EMBEDDINGS] = state[device_train.WORD_EMBEDDINGS] + 1.0  # trained, not frozen
    torch.save(state, run / "best_model.pt")
    (carry / device_train.BASE_DIR).mkdir(parents=True)
    device_train.pack_base(base, carry / device_train.BASE_DIR)
    summary = device_train.pack(run, tmp_path / "files", carry / device_train.BASE_DIR / device_train.WEIGHTS_FILE)
    assert summary["kind"] == "best" and summary["word_embeddings_frozen"] is False
    packed = {k for shard in (tmp_path / "files").glob("shard*.safetensors") for k in load_file(str(shard))}
    assert device_train.WORD_EMBEDDINGS in packed  # not frozen: it travels
