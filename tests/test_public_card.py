"""``GET /v1/model`` is a card, not a dump: a few KB, no path of the machine that trained or exported the
model, no free text that can go stale; the full card stays in the model directory."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from service_conftest import FakeClassifier, live_server

from dialogue_safety.core.model_card import ModelCard, public_card

REPO = Path(__file__).resolve().parents[1]
# a few KB: 0.5.0's card names 23 training sources with their licences and test F1 on 29 sets (4.3 KB)
MAX_BYTES = 8192
# a path of some machine: /home/..., /work/..., C:\...
ABSOLUTE_PATH = re.compile(r"(^|[\s\"'=(])(/[A-Za-z0-9_.-]+){2,}|[A-Za-z]:\\\\")


def strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (str(k), *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return [value] if isinstance(value, str) else []


def leaky_card() -> ModelCard:
    """The shipped card with what a training machine writes into it: paths and long text."""
    card = ModelCard.load(REPO / "models" / "default")
    card.training = {**card.training, "recipe": {**card.training.get("recipe", {}), "init_from": "/home/me/ckpt/last"}}
    card.export = {**card.export, "source_checkpoint": "/srv/train/runs/0.4.0/best"}
    card.base_model = "/home/me/models/bert-base-uncased"
    card.limitations = [*card.limitations, "x" * 5000]
    return card


def test_the_public_card_is_small_and_names_no_path_of_the_training_machine() -> None:
    full = leaky_card()
    public = public_card(full)
    text = json.dumps(public)
    assert len(text.encode()) < MAX_BYTES * 3 / 4  # room for the serving block
    assert len(full.model_dump_json()) > 10 * len(text)  # the full card is still all there, in the directory
    assert not [s for s in strings(public) if ABSOLUTE_PATH.search(s)], text
    assert "limitations" not in public and "intended_use" not in public and "export" not in public
    assert public["base_model"] == "bert-base-uncased"
    # what the answers depend on is there, as in force
    assert public["threshold"] == full.threshold and public["heads"] == full.heads
    assert public["test_metrics"]["diasafety"]["offensive_f1"] == round(
        full.metrics["test"]["diasafety"]["all"]["offensive_f1"], 1
    )


def test_get_v1_model_answers_the_public_card_with_the_serving_block() -> None:
    fake = FakeClassifier()
    fake.card = leaky_card()
    fake.model_id = fake.card.model_id
    with live_server(classifier=fake) as server, server.client() as client:
        response = client.get("/v1/model")
    assert response.status_code == 200
    assert len(response.content) < MAX_BYTES, f"{len(response.content)} bytes"
    body = response.json()
    assert not [s for s in strings(body) if ABSOLUTE_PATH.search(s)], body
    assert {k: v for k, v in body.items() if k != "serving"} == public_card(fake.card)
    assert body["serving"]["model"] == fake.card.model_id
