"""`dialogue-safety break-it` (new-round, add-contexts, export, status) and the `breakit` source:
validated attacks only, split by attacker, contrasts flipped, rounds kept, malformed files named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from breakit_conftest import scores

from dialogue_safety.breakit.export import assign_splits
from dialogue_safety.breakit.game import Mode, Verdict
from dialogue_safety.breakit.pool import safe_contexts
from dialogue_safety.breakit.store import open_store
from dialogue_safety.cli.breakit import main, screen_pool
from dialogue_safety.core.model_card import CARD_FILE
from dialogue_safety.core.schema import Label, Split
from dialogue_safety.sources.errors import DatasetFormatError
from dialogue_safety.sources.registry import describe_source, load_source

FIXTURES = Path(__file__).parent / "fixtures" / "sources" / "full"


def test_the_fixture_round_loads() -> None:
    examples = load_source("breakit", FIXTURES)
    assert {e.round for e in examples} == {"1"} and {e.source for e in examples} == {"breakit"}
    assert [e.split for e in examples].count(Split.TRAIN) == 3
    contrast = next(e for e in examples if e.metadata["kind"] == "contrast")
    assert contrast.label is Label.SAFE and contrast.history[0].speaker == "user"


def test_assign_splits_keeps_each_attacker_on_one_side() -> None:
    attackers = [f"p{i}" for i in range(20)]
    splits = assign_splits(attackers, 1)
    counts = {s: sum(v is s for v in splits.values()) for s in Split}
    assert counts == {Split.TRAIN: 16, Split.VALID: 2, Split.TEST: 2}
    assert assign_splits(reversed(attackers), 1) == splits  # order does not matter
    assert set(assign_splits(["a", "b"], 1).values()) == {Split.TRAIN}
    assert sorted(s.value for s in assign_splits(["a", "b", "c"], 1).values()) == ["test", "train", "valid"]


def test_new_round_export_and_load_round_trip(tmp_path: Path, tiny_model_dir: Path) -> None:  # noqa: F811
    db = str(tmp_path / "game.sqlite3")
    pool = tmp_path / "pool.jsonl"
    talk = ["my cat knocked over the christmas tree again", "oh no, is the cat alright after all that?"]
    lines = [talk, {"turns": [{"text": "ok"}, {"text": "restart Hey"}]}, {"turns": [{"text": "x"}]}]
    pool.write_text("".join(json.dumps(line) + "\n" for line in lines))  # the last two are not conversations
    rc = main(["new-round", "--db", db, "--round", "1", "--model", str(tiny_model_dir),
               "--reference", f"A0={tiny_model_dir}", "--pool", str(pool),
               "--pool-source", "diasafety", "--data-dir", str(FIXTURES), "--pool-size", "3",
               "--screen-model", "none"])  # fmt: skip
    assert rc == 0
    store = open_store(db)
    try:
        assert store.round(1).model_id == "tiny-random@0.0.1" and set(store.round(1).references) == {"A0"}
        assert store.context_count(1) == 1 + len(safe_contexts(["diasafety"], FIXTURES, 3)) >= 2
        players = [store.register_player(f"p{i}") for i in range(6)]
        validator = store.register_player("validator")
        expected: dict[str, Label] = {}
        for i, p in enumerate(players):
            task, _ = store.start_task(1, p.id, Mode.OFFENSIVE if i % 2 == 0 else Mode.SAFE, with_context=True)
            for k in range(3):
                fooling = scores(0.1) if i % 2 == 0 else scores(0.9)
                attack, _ = store.record_attack(task.id, p.id, f"attack {i}-{k}", fooling)
                if k == 0:
                    store.validate(attack.id, validator.id, Verdict.CONFIRM, contrast_text=f"contrast {i}")
                    expected[f"attack {i}-{k}"] = attack.intended_label
                elif k == 1:
                    store.validate(attack.id, validator.id, Verdict.REJECT)  # not validated
                else:
                    store.validate(attack.id, validator.id, Verdict.CONFIRM, flagged=True)  # flagged: left out
            store.record_attack(task.id, p.id, f"held {i}", scores(0.9) if i % 2 == 0 else scores(0.1))
    finally:
        store.close()

    out = tmp_path / "data"
    assert main(["export", "--db", db, "--round", "1", str(out)]) == 0
    meta = json.loads((out / "breakit" / "round-1" / "round.json").read_text())
    assert len(meta["left_out"]["flagged"]) == 6 and len(meta["left_out"]["not_validated"]) == 6
    assert meta["contrasts"] == 6 and meta["model"] == "tiny-random@0.0.1"
    assert describe_source("breakit", out).usable

    examples = load_source("breakit", out)
    attacks = [e for e in examples if e.metadata["kind"] == "attack"]
    assert {e.utterance: e.label.value for e in attacks} == {k: v for k, v in expected.items()}
    assert all(e.round == "1" and e.history for e in examples)
    by_attacker: dict[str, set[Split]] = {}
    for e in examples:
        by_attacker.setdefault(e.metadata["attacker"], set()).add(e.split)
    assert all(len(s) == 1 for s in by_attacker.values())  # no attacker on both sides
    assert {next(iter(s)) for s in by_attacker.values()} == set(Split)
    for e in examples:
        if e.metadata["kind"] == "contrast":
            twin = next(a for a in attacks if a.metadata["attack_id"] == e.metadata["attack_id"])
            assert e.label is not twin.label and e.split is twin.split and e.utterance.startswith("contrast")
            assert set(e.metadata["scores"]) == {"m@1"}


def test_the_pool_is_screened_by_a_model(tmp_path: Path, tiny_model_dir: Path) -> None:  # noqa: F811
    pool = [[{"speaker": "user", "text": "hi"}, {"speaker": "bot", "text": "hello"}], [{"speaker": None, "text": "yo"}]]
    for threshold, kept in ((0.0, 0), (1.0, 2)):  # at 0 the model flags every turn; at 1 none
        model = tmp_path / f"t{threshold}"
        shutil.copytree(tiny_model_dir, model)
        card = json.loads((model / CARD_FILE).read_text())
        (model / CARD_FILE).write_text(json.dumps({**card, "threshold": threshold}))
        assert len(screen_pool(pool, model)) == kept


def test_malformed_files_name_file_and_line(tmp_path: Path) -> None:
    folder = tmp_path / "breakit" / "round-2"
    folder.mkdir(parents=True)
    good = {"id": "x", "round": 2, "kind": "attack", "utterance": "u", "label": "SAFE"}
    (folder / "valid.jsonl").write_text("")
    (folder / "test.jsonl").write_text("")
    for bad, problem in [
        ({**good, "label": "RUDE"}, "unknown label 'RUDE'"),
        ({**good, "round": 3}, "round 3 in the folder of round 2"),
        ({**good, "history": [{"speaker": "u"}]}, "history[0]"),
        ({k: v for k, v in good.items() if k != "kind"}, "missing 'kind'"),
    ]:
        (folder / "train.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(DatasetFormatError) as err:
            load_source("breakit", tmp_path)
        assert str(err.value).startswith(f"{folder / 'train.jsonl'}:2: ") and problem in str(err.value)


def test_cli_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SAFETY_BREAKIT_DB", raising=False)
    assert main(["status"]) == 2 and "--db" in capsys.readouterr().err
    db = str(tmp_path / "g.sqlite3")
    assert main(["export", "--db", db, "--round", "4", str(tmp_path / "o")]) == 2  # no database made for it
    assert "no break-it database" in capsys.readouterr().err
    pool = tmp_path / "pool.jsonl"
    pool.write_text('["fine"]\n[]\n')
    assert main(["add-contexts", "--db", db, "--round", "1", "--pool", str(pool)]) == 2
    assert f"{pool}:2:" in capsys.readouterr().err
    assert main(["export", "--db", db, "--round", "4", str(tmp_path / "o")]) == 2
    assert "no round 4" in capsys.readouterr().err


def test_all_contexts_keeps_what_is_not_a_conversation(tmp_path: Path, tiny_model_dir: Path) -> None:  # noqa: F811
    db = str(tmp_path / "game.sqlite3")
    pool = tmp_path / "pool.jsonl"
    talk = ["my cat knocked over the christmas tree again", "oh no, is the cat alright after all that?"]
    pool.write_text(json.dumps(talk) + "\n" + json.dumps(["ok", "restart Hey"]) + "\n")
    args = ["--db", db, "--round", "1", "--pool", str(pool)]
    assert main(["new-round", *args, "--model", str(tiny_model_dir), "--screen-model", "none"]) == 0
    assert main(["add-contexts", *args, "--all-contexts", "--screen-model", "none"]) == 0
    store = open_store(db)
    try:
        assert store.context_count(1) == 1 + 2
    finally:
        store.close()


from service_conftest import tiny_model_dir  # noqa: E402, F401  (fixture)


@pytest.mark.parametrize(
    ("turns", "kept"),
    [
        (["ok", "restart Hey"], False),
        (["hi", "hello there, how are you doing today?"], False),
        (["I got a puppy today", "nice"], False),
        (["what do you think about my new haircut?", "honestly it looks great on you, very fresh"], True),
        (["I finally finished my first marathon!", "Congratulations! How long did it take?"], True),
        (["one long turn that talks about many things at once and goes on"], False),
    ],
)
def test_the_pool_keeps_only_conversations(turns: list[str], kept: bool) -> None:
    from dialogue_safety.breakit.pool import is_conversation

    assert is_conversation([{"speaker": None, "text": t} for t in turns]) is kept
