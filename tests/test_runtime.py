"""OnnxClassifier: batch = single, caller's order, threshold, scores, errors, parity, variants, no torch."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_fp32_parity
from tokenizers import Tokenizer

from dialogue_safety.core import variants
from dialogue_safety.core.batch_budget import token_budget_batches
from dialogue_safety.core.model_card import ModelCard
from dialogue_safety.core.runtime import ModelLoadError, OnnxClassifier, cpu_defaults, physical_cores
from dialogue_safety.core.schema import Example, Label
from dialogue_safety.core.variants import cache as variant_cache
from dialogue_safety.core.variants import cli as variants_cli
from dialogue_safety.core.variants.stamps import file_sha256, read_stamp
from lab.int8_presets import RESEARCH_INT8_PRESETS

REPO = Path(__file__).resolve().parents[1]

DIALOGUES = [
    Example.from_texts("you are an idiot"),
    Example.from_texts("thanks, that was helpful", ["can you help me?", "sure, what is it?"]),
    Example.from_texts("ok"),
    Example.from_texts(" ".join(["blah"] * 200), ["context " * 50]),
    Example.from_texts("people like you should not vote", ["hi", "hello", "what about the election?"]),
    Example.from_texts("🐍 go back where you came from", ["where are you from?"]),
    Example.from_texts("i agree", ["women are worse drivers"]),
    Example.from_texts("nice weather today isn't it", ["good morning"]),
    Example.from_texts("shut up", []),
    Example.from_texts("what a lovely picture of your dog, he looks so happy", ["look at my dog"]),
]


@pytest.fixture(scope="module")
def two_head_checkpoint(tiny_tokenizer: Tokenizer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random BERT with two heads whose logits are spread out (scaled classifier)."""
    import torch

    from dialogue_safety.training.checkpoint import save_checkpoint
    from dialogue_safety.training.modeling import build_model

    torch.manual_seed(1)
    model = build_model("random:tiny", ["offensive", "hateful"], vocab_size=tiny_tokenizer.get_vocab_size())
    from dialogue_safety.core.encoding import DialogueEncoder, pad_batch

    model.eval()
    batch = pad_batch(DialogueEncoder(tiny_tokenizer).encode_batch(DIALOGUES))
    with torch.no_grad():  # rescale the heads so that logits on DIALOGUES have mean 0 and std 2
        pooled = model.bert(**{k: torch.from_numpy(v) for k, v in batch.items()}).pooler_output
        raw = pooled @ model.classifier.weight.T
        model.classifier.weight.mul_(2.0 / raw.std(dim=0, keepdim=True).T)
        model.classifier.bias.copy_(-(pooled @ model.classifier.weight.T).mean(dim=0))
    card = ModelCard(
        name="tiny-two-heads",
        version="0.0.2",
        heads=["offensive", "hateful"],
        score_heads=["offensive", "hateful"],
        temperatures={"offensive": 2.0},
        threshold=0.5,
    )
    return save_checkpoint(tmp_path_factory.mktemp("ckpt2"), model, tiny_tokenizer, card)


@pytest.fixture(scope="module")
def model_dir(two_head_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dialogue_safety.export.onnx_export import export_checkpoint

    out = tmp_path_factory.mktemp("runtime") / "model"
    export_checkpoint(two_head_checkpoint, out, variant_names=["fp32"], ship=True)
    return out


@pytest.fixture(scope="module")
def clf(model_dir: Path) -> OnnxClassifier:
    return OnnxClassifier(model_dir, variant="fp32")


def test_attributes(clf: OnnxClassifier, model_dir: Path) -> None:
    assert clf.model_id == "tiny-two-heads@0.0.2" == clf.card.model_id
    assert clf.variant == "fp32" and clf.provider == "CPUExecutionProvider"
    assert clf.path == model_dir / "model.fp32.onnx"
    assert clf.encoder.config == clf.card.encoding_config


def test_warmup_runs_each_shape_and_reports_the_time_it_took(
    clf: OnnxClassifier, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    predict = clf.predict

    def counting(examples: Any, threshold: float | None = None) -> Any:
        calls.append(len(examples))
        return predict(examples, threshold)

    monkeypatch.setattr(clf, "predict", counting)
    start = time.perf_counter()
    took = clf.warmup(rounds=2)
    assert 0 < took <= time.perf_counter() - start
    assert calls == [1, 1, 1, 1]  # a short dialogue and a full-length one, each round


def test_scores_follow_the_card(clf: OnnxClassifier) -> None:
    logits = clf.logits(DIALOGUES)
    assert logits.shape == (len(DIALOGUES), 2) and np.ptp(logits) > 1.0, "scores should be spread out"
    expected_probs = 1 / (1 + np.exp(-logits / np.array([2.0, 1.0])))
    preds = clf.predict(DIALOGUES)
    for p, probs in zip(preds, expected_probs, strict=True):
        assert p.categories == pytest.approx({"offensive": probs[0], "hateful": probs[1]}, abs=1e-6)
        assert p.score == pytest.approx(max(probs), abs=1e-6)
        assert p.label == Label.from_bool(p.score >= 0.5) and p.threshold == 0.5
    np.testing.assert_allclose(clf.predict_proba(DIALOGUES), [p.score for p in preds], atol=1e-9)


def test_batch_equals_single(clf: OnnxClassifier) -> None:
    batch = clf.predict(DIALOGUES)
    for ex, p in zip(DIALOGUES, batch, strict=True):
        (single,) = clf.predict([ex])
        assert single.score == pytest.approx(p.score, abs=1e-5)
        assert single.categories == pytest.approx(p.categories, abs=1e-5)


def test_order_is_the_callers_under_any_batching(model_dir: Path, clf: OnnxClassifier) -> None:
    many = DIALOGUES * 5
    random.Random(0).shuffle(many)
    expected = [clf.predict([ex])[0].score for ex in many]
    small = OnnxClassifier(model_dir, variant="fp32", max_batch_tokens=200, max_batch_size=3)
    for c in (clf, small):
        got = [p.score for p in c.predict(many)]
        np.testing.assert_allclose(got, expected, atol=1e-5)
    encoded = small.encode(many)
    for idx in small.batches(encoded):
        width = max(len(encoded[i]) for i in idx)
        assert len(idx) <= 3 and (len(idx) == 1 or len(idx) * width <= 200)
    # a call that fits the budget (what the micro-batcher sends) runs as one batch, in the caller's order
    fitting = encoded[:3] if 3 * max(len(e) for e in encoded[:3]) <= 200 else encoded[:1]
    assert [idx.tolist() for idx in small.batches(fitting)] == [list(range(len(fitting)))]


def test_token_budget_batches_cover_everything_once() -> None:
    lengths = [5, 128, 7, 7, 64, 1, 300, 12]
    batches = list(token_budget_batches(lengths, max_batch_tokens=140, max_batch_size=4))
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(lengths)))
    assert batches[0].tolist() == [6]  # longer than the budget: alone
    for b in batches:
        assert len(b) <= 4 and (len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 140)


def test_threshold_override(clf: OnnxClassifier) -> None:
    scores = sorted(p.score for p in clf.predict(DIALOGUES))
    mid = (scores[3] + scores[4]) / 2
    preds = clf.predict(DIALOGUES, threshold=mid)
    assert all(p.threshold == mid for p in preds)
    assert sum(p.label is Label.OFFENSIVE for p in preds) == len(DIALOGUES) - 4
    assert all(p.label is Label.OFFENSIVE for p in clf.predict(DIALOGUES, threshold=0.0))
    encoded = clf.encode(DIALOGUES)
    assert [p.label for p in clf.predict_encoded(encoded, threshold=mid)] == [p.label for p in preds]


def test_empty_input(clf: OnnxClassifier) -> None:
    assert clf.predict([]) == [] and clf.predict_encoded([]) == []
    assert clf.predict_proba([]).shape == (0,)


def test_torch_parity(two_head_checkpoint: Path, model_dir: Path) -> None:
    import torch

    from dialogue_safety.training.checkpoint import load_checkpoint

    model, encoder, _ = load_checkpoint(two_head_checkpoint)
    onnx_logits = OnnxClassifier(model_dir, variant="fp32").logits(DIALOGUES)
    with torch.no_grad():  # the export rounded the weights to fp16 (--ship): compare with those
        for p in model.parameters():
            p.copy_(p.half().float())
    # this head is rescaled (logits of std 2 from terms of magnitude ~1400): a fixed 1e-4 failed on
    # Intel AVX-512 CPUs by the accumulation order alone; the allowance follows the computation
    for ex, row in zip(DIALOGUES, onnx_logits, strict=True):
        assert_fp32_parity(row[None, :], model, encoder.encode_batch([ex]), encoder.pad_id)


def test_missing_and_corrupt_model_dirs(model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model directory"):
        OnnxClassifier(tmp_path / "absent")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no model card"):
        OnnxClassifier(empty)
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "model.onnx").write_bytes(b"this is not a protobuf")
    for f in broken.glob("model.*.onnx"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="model.onnx"):
        OnnxClassifier(broken, variant="fp32")
    (broken / "tokenizer.json").write_text("{")
    with pytest.raises(ModelLoadError, match="tokenizer"):
        OnnxClassifier(broken)
    (broken / "model_card.json").write_text('{"threshold": "high"}')
    with pytest.raises(ModelLoadError, match="invalid model card"):
        OnnxClassifier(broken)
    with pytest.raises(ModelLoadError, match="unknown variant"):
        OnnxClassifier(model_dir, variant="int4")
    with pytest.raises(ModelLoadError, match="CUDA"):
        OnnxClassifier(model_dir, variant="fp16", providers=["CPUExecutionProvider"])


def _without_derived_files(model_dir: Path, tmp_path: Path) -> Path:
    """A copy of ``model_dir`` with only its committed files (the variants still to derive)."""
    work = tmp_path / "model"
    shutil.copytree(model_dir, work)
    for f in work.glob("model.*.onnx"):
        f.unlink()
    return work


def test_variants_are_derived_once_stamped_and_refreshed(model_dir: Path, tmp_path: Path) -> None:
    work = _without_derived_files(model_dir, tmp_path)
    int8 = OnnxClassifier(work, variant="int8")
    assert int8.path == work / "model.int8.onnx" and (work / "model.fp32.onnx").is_file()
    assert (work / "model.optimized.onnx").is_file()
    stamp = read_stamp(int8.path)
    assert stamp["variant"] == "int8"
    assert stamp["artifact_sha256"] == file_sha256(work / "model.onnx")
    first = int8.path.stat().st_mtime_ns
    scores = int8.predict_proba(DIALOGUES)  # (the heads of this model amplify int8 noise: no closeness check)
    assert scores.shape == (len(DIALOGUES),) and np.all((scores >= 0) & (scores <= 1))
    # cached: a second load does not derive again
    assert OnnxClassifier(work, variant="int8").path.stat().st_mtime_ns == first
    # deterministic: deriving again gives the same bytes
    before = file_sha256(work / "model.int8.onnx")
    variants.ensure_variant(work, "int8", force=True)
    assert file_sha256(work / "model.int8.onnx") == before
    # a changed recipe makes the cached file stale
    card = ModelCard.load(work)
    card.export["recipes"]["int8"]["per_channel"] = False
    card.save(work)
    OnnxClassifier(work, variant="int8")
    assert read_stamp(work / "model.int8.onnx")["recipe"] != stamp["recipe"]
    # a damaged derived file is derived again
    (work / "model.optimized.onnx").write_bytes(b"garbage")
    assert OnnxClassifier(work, variant="optimized").predict_proba(DIALOGUES[:2]).shape == (2,)


def test_read_only_model_dir_derives_into_the_cache(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = _without_derived_files(model_dir, tmp_path)
    monkeypatch.setenv("DIALOGUE_SAFETY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(variant_cache, "writable", lambda d: d != work)
    clf = OnnxClassifier(work, variant="optimized")
    assert clf.path.parent.parent == tmp_path / "cache"
    assert not (work / "model.optimized.onnx").exists()


def test_default_variant_is_the_cpu_default_for_this_cpu(model_dir: Path) -> None:
    from dialogue_safety.core.runtime import cpu_default

    card = ModelCard.load(model_dir)
    clf = OnnxClassifier(model_dir)
    assert clf.variant == cpu_default(card)[0] and clf.variant in (card.cpu_candidates or [card.cpu_variant])


def test_thread_settings() -> None:
    assert 1 <= physical_cores() <= (os.cpu_count() or 1)


def test_runtime_never_imports_torch(model_dir: Path) -> None:
    code = (
        "import sys\n"
        "import dialogue_safety.core.runtime, dialogue_safety.core.variants\n"
        "from dialogue_safety.core.runtime import OnnxClassifier\n"
        "from dialogue_safety.core.schema import Example\n"
        f"clf = OnnxClassifier({str(model_dir)!r}, variant='optimized')\n"
        "clf.predict([Example.from_texts('hello', ['hi'])])\n"
        "banned = {'torch', 'transformers', 'optimum'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in banned  # and nothing of ours above core:\n"
        "             or (m.startswith('dialogue_safety.') and not m.startswith('dialogue_safety.core')))\n"
        "assert not bad, bad\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_int8_attention_preset_keeps_the_feed_forward_in_fp32(model_dir: Path, tmp_path: Path) -> None:
    import onnx

    work = tmp_path / "model"
    shutil.copytree(model_dir, work)
    optimized = onnx.load(str(variants.ensure_variant(work, "optimized")))
    full = variants.derive(optimized, variants.INT8_PRESETS["all"])
    partial = variants.derive(optimized, RESEARCH_INT8_PRESETS["attention"])

    def fp32_matmuls(graph: onnx.ModelProto) -> list[str]:
        return [n.name for n in graph.graph.node if n.op_type == "MatMul"]

    assert fp32_matmuls(full) == []
    kept = fp32_matmuls(partial)
    assert len(kept) == 4 and all("dense/MatMul" in n and "attention" not in n for n in kept)
    assert any(n.op_type == "QAttention" for n in partial.graph.node)


def test_variants_can_be_derived_ahead_of_time(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    work = tmp_path / "model"
    shutil.copytree(model_dir, work)
    assert variants_cli.main([str(work), "optimized"]) == 0
    assert "optimized:" in capsys.readouterr().out and (work / "model.optimized.onnx").is_file()
    assert variants_cli.main([str(tmp_path / "absent")]) == 2


def test_int8_with_8bit_weights_needs_vnni() -> None:
    from dialogue_safety.core.cpu import cpu_has_vnni
    from dialogue_safety.core.model_card import ModelCard
    from dialogue_safety.core.runtime import int8_supported

    zen3 = "processor : 0\nflags : fpu sse avx2 fma\n"
    zen4 = "processor : 0\nflags : fpu avx2 avx512f avx512_vnni\n"
    arm = "processor : 0\nFeatures : fp asimd asimddp\n"
    assert (cpu_has_vnni(zen3), cpu_has_vnni(zen4), cpu_has_vnni(arm)) == (False, True, None)
    eight_bit = ModelCard(export={"recipes": {"int8": {"reduce_range": False}}})
    seven_bit = ModelCard(export={"recipes": {"int8": {"reduce_range": True}}})
    assert int8_supported(eight_bit, zen3)[0] is False
    assert int8_supported(eight_bit, zen4)[0] is True and int8_supported(eight_bit, arm)[0] is True
    assert int8_supported(seven_bit, zen3)[0] is True
    unsaid = ModelCard(export={"recipes": {"int8": {"kind": "quantize_dynamic"}}})  # the quantisers' default: 8-bit
    assert int8_supported(unsaid, zen3)[0] is False
    assert int8_supported(ModelCard(), zen3)[0] is True  # no recipe in the card: the default one, 7-bit weights


def test_an_image_keeps_one_variant_and_never_derives_at_start(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    work = _without_derived_files(model_dir, tmp_path)
    assert variants_cli.main([str(work), "cpu", "--prune"]) == 0  # what the Dockerfile runs
    card = ModelCard.load(work)
    kept = work / variants.variant_file(card.cpu_variant, card, work / "model.onnx")
    derived = sorted(p.name for p in work.glob("model.*.onnx"))
    assert derived == [kept.name], "only the variant the service runs is left, no intermediate fp32 graph"
    assert not (work / ".variants.lock").exists()
    before = kept.stat().st_mtime_ns
    # as in the image: the service user cannot write the model directory
    monkeypatch.setenv("DIALOGUE_SAFETY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(variant_cache, "writable", lambda d: d != work)
    clf = OnnxClassifier(work)
    assert clf.path == kept and kept.stat().st_mtime_ns == before
    assert sorted(p.name for p in work.glob("model.*.onnx")) == [kept.name]
    assert not list((tmp_path / "cache").rglob("*.onnx")), "nothing was derived at start"


# --- windows over long utterances (issue #25) -----------------------------------------------------------
LONG = " ".join(["you are a very stupid idiot and i hate you because you are"] * 40)  # ~520 tokens


def test_a_long_utterance_scores_the_maximum_over_its_windows(clf: OnnxClassifier) -> None:
    from dialogue_safety.core.scoring import predictions_from_logits

    for example in (Example(utterance=LONG), Example.from_texts(LONG, ["hi", "hello how are you"])):
        (encoded,) = clf.encode([example])
        assert len(encoded.rows) > 3
        per_window = np.concatenate([clf.run_batch([row]) for row in encoded.rows])
        (want,) = predictions_from_logits(per_window.max(axis=0, keepdims=True), clf.card)
        (got,) = clf.predict([example])
        assert got.score == pytest.approx(want.score, abs=1e-5)
        assert got.categories == pytest.approx(want.categories, abs=1e-5)
        assert got.read.windows == len(encoded.rows) and not got.read.truncated
        assert per_window.max() - per_window.min() > 0  # the windows differ: the maximum is a choice


def test_windows_batch_equals_single_and_the_budget_counts_rows(model_dir: Path, clf: OnnxClassifier) -> None:
    many = [*DIALOGUES, Example(utterance=LONG), Example.from_texts(LONG[:1500], ["hi"])] * 2
    expected = [clf.predict([ex])[0].score for ex in many]
    small = OnnxClassifier(model_dir, variant="fp32", max_batch_tokens=300, max_batch_size=4)
    for c in (clf, small):
        np.testing.assert_allclose([p.score for p in c.predict(many)], expected, atol=1e-5)
    encoded = small.encode(many)
    widths, rows = [e.width for e in encoded], [len(e.rows) for e in encoded]
    for idx in token_budget_batches(widths, 300, 4, rows):
        assert len(idx) == 1 or sum(rows[i] for i in idx) * max(widths[i] for i in idx) <= 300


def test_the_window_cap_reads_the_first_windows_and_says_what_it_left(model_dir: Path) -> None:
    capped = OnnxClassifier(model_dir, variant="fp32", max_windows=2)
    (p,) = capped.predict([Example(utterance=LONG)])
    assert p.read.windows == 2 and p.read.windows_needed > 2
    assert 0 < p.read.utterance_chars_unread < len(LONG) and p.read.truncated
    unread = p.read.utterance_chars_unread
    assert p.reading()["truncated"] == {"utterance_chars_unread": unread, "history_turns_dropped": 0}
    (first,) = OnnxClassifier(model_dir, variant="fp32", max_windows=1).predict([Example(utterance=LONG)])
    assert first.read.windows == 1 and first.read.utterance_chars_unread > p.read.utterance_chars_unread


def test_token_budget_batches_count_rows() -> None:
    lengths, rows = [100, 100, 50, 50, 50], [3, 1, 1, 4, 1]
    batches = [b.tolist() for b in token_budget_batches(lengths, 400, 8, rows)]
    assert sorted(i for b in batches for i in b) == list(range(5))
    for b in batches:
        assert len(b) == 1 or sum(rows[i] for i in b) * max(lengths[i] for i in b) <= 400
    assert batches[0] == [0, 1]  # 4 rows of 100


def test_an_image_of_a_checked_int8_default_keeps_fp32_for_the_check(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = _without_derived_files(model_dir, tmp_path)
    card = ModelCard.load(work)
    card.cpu_variant = "int8"
    card.export.setdefault("recipes", {})["int8"] = dict(variants.INT8_PRESETS["dynamic"])
    card.export["int8_verify"] = {"band": 0.05, "against": "fp32"}
    card.save(work)
    assert card.serving_variants("int8") == ["int8", "fp32"] and card.serving_variants("fp32") == ["fp32"]
    assert variants_cli.main([str(work), "cpu", "--prune"]) == 0
    # every variant the runtime may pick on some CPU (an 8-bit int8's exact fallback too: core.runtime.cpu_defaults)
    kept = {v for name in cpu_defaults(card) for v in card.serving_variants(name)}
    assert {"int8", "fp32"} <= kept
    names = {variants.variant_file(v, card, work / "model.onnx") for v in kept}
    assert {p.name for p in work.glob("model.*.onnx")} == names - {"model.onnx"}
    monkeypatch.setenv("DIALOGUE_SAFETY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(variant_cache, "writable", lambda d: d != work)
    monkeypatch.setattr("dialogue_safety.core.runtime.int8_supported", lambda card, cpuinfo=None: (True, "test"))
    clf = OnnxClassifier(work)
    assert clf.variant == "int8" and clf.check_band == 0.05
    assert not list((tmp_path / "cache").rglob("*.onnx")), "nothing was derived at start"
