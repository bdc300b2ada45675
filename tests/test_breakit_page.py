"""What the /break-it page shows, in a real browser (headless Debian ``chromium`` driven by
Playwright; fails without it): per-word explanations of the live score (utterance and context
words shaded by their contributions), the threshold on the meter, a meter colour that is the
verdict's, a clean slate on a new task, errors next to the control that caused them, the flag
reason, a board that counts only validated (unflagged) attacks, sign-up and nickname rules, and a
pool without placeholder conversations.

The service runs the fake classifier (tests/service_conftest.py: a message with a bad word scores
0.9, else 0.1; each bad word in the context adds 0.05) behind real uvicorn, so every number on
the page is known exactly; the real model's page is covered by test_breakit_browser.py.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from service_conftest import SCOREBOARD_ROWS_JS, FakeClassifier, LiveServer, live_server
from test_breakit_browser import browser, chromium_path, shot  # noqa: F401  (fixture)

from dialogue_safety.cli.breakit import main as breakit_cli
from dialogue_safety.service.settings import ServiceSettings

pytestmark = pytest.mark.browser  # needs Chromium; scripts/test.sh installs it, no other test does

KEY = "page-key"
CONTEXT = [
    {"speaker": "user", "text": "my idiot boss moved the meeting again"},
    {"speaker": "bot", "text": "that sounds frustrating, what happened?"},
]
PLACEHOLDER = [{"speaker": "agent", "text": "ok"}, {"speaker": "user", "text": "restart Hey"}]


def cli(*args: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert breakit_cli(list(args)) == 0
    return [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def game(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Iterator[LiveServer]:  # noqa: F811
    root = tmp_path_factory.mktemp("page")
    db = root / "game.sqlite3"
    pool = root / "pool.jsonl"
    pool.write_text(json.dumps(CONTEXT) + "\n" + json.dumps(PLACEHOLDER) + "\n")
    cli("new-round", "--db", str(db), "--round", "1", "--model", str(tiny_model_dir), "--pool", str(pool),
        "--screen-model", "none", "--rate", "try:player=100/minute")  # fmt: skip
    settings = ServiceSettings(host="127.0.0.1", port=0, breakit_db=str(db), api_key=KEY, max_wait_ms=0.5)
    with live_server(settings, FakeClassifier()) as live:
        live.extra.update(db=db)
        yield live


def open_page(browser: Any, game: LiveServer, nickname: str) -> Any:  # noqa: F811
    [row] = cli("invite", "--db", str(game.extra["db"]), nickname)
    page = browser.new_context(viewport={"width": 1000, "height": 900}).new_page()
    page.goto(f"{game.url}/break-it#token={row['token']}")
    page.wait_for_selector("#play:not(.hidden)")
    return page


def type_draft(page: Any, text: str) -> None:
    page.fill("#attack-text", text)
    page.wait_for_function(f"document.getElementById('explanation').textContent === {json.dumps(text)}")


def contributions(page: Any, selector: str) -> dict[str, float]:
    spans = page.locator(f"{selector} .word[data-contribution]").all()
    return {s.inner_text(): float(s.get_attribute("data-contribution")) for s in spans}


@pytest.mark.slow
def test_the_live_score_is_explained_word_by_word(browser: Any, game: LiveServer) -> None:  # noqa: F811
    page = open_page(browser, game, "alice")
    page.click("#start-task")
    page.wait_for_selector("#context .turn")
    assert page.locator("#context .turn").count() == 2  # the placeholder conversation was left out of the pool
    type_draft(page, "what a stupid idiot")
    assert page.inner_text("#live-score") == "0.950"  # 0.9 + 0.05 for "idiot" in the context
    words = contributions(page, "#explanation")
    # 16 words in all (4 + the context's 12): sampled Shapley values, exact shares are 0.4, 0.4, 0.05
    assert words["stupid"] > 0.25 and words["idiot"] > 0.25  # redundant insults: both get a large share
    assert abs(words["what"]) < 0.1 and abs(words["a"]) < 0.1
    history = [float(s.get_attribute("data-contribution")) for s in page.locator("#context .word").all()]
    assert len(history) == 12 and all(abs(c) < 0.2 for c in history)  # the context's words, shaded too
    assert sum(words.values()) + sum(history) == pytest.approx(0.95 - 0.1, abs=2e-3)  # efficient
    colour = page.locator("#explanation .word", has_text="stupid").evaluate("e => getComputedStyle(e).backgroundColor")
    plain = page.locator("#explanation .word", has_text="what").evaluate("e => getComputedStyle(e).backgroundColor")
    alpha = lambda css: float(css.rstrip(")").split(",")[-1])  # noqa: E731
    assert colour.startswith("rgba(198, 40, 40") and alpha(colour) > 0.5 > 0.1 > alpha(plain)  # shaded by size
    shot(page, "break-it-explained")


@pytest.mark.slow
def test_the_meter_marks_the_threshold_and_takes_the_verdicts_colour(browser: Any, game: LiveServer) -> None:  # noqa: F811
    page = open_page(browser, game, "meter")
    page.uncheck("#with-context")
    page.click("#start-task")
    page.wait_for_selector("#task:not(.hidden)")
    fill = "getComputedStyle(document.getElementById('live-meter')).backgroundColor"
    box = page.locator("#live-meter-box").bounding_box()
    mark = page.locator("#threshold-mark").bounding_box()
    assert page.is_hidden("#threshold-mark")  # nothing scored yet
    type_draft(page, "have a lovely day")
    assert page.inner_text("#live-label") == "SAFE" and page.evaluate(fill) == "rgb(46, 125, 50)"  # green, no gradient
    assert page.evaluate("getComputedStyle(document.getElementById('live-meter')).backgroundImage") == "none"
    mark = page.locator("#threshold-mark").bounding_box()
    assert (mark["x"] + mark["width"] / 2 - box["x"]) / box["width"] == pytest.approx(0.5, abs=0.01)  # threshold 0.5
    assert page.locator("#live-meter").bounding_box()["width"] / box["width"] == pytest.approx(0.1, abs=0.01)
    type_draft(page, "you idiot")
    assert page.inner_text("#live-label") == "OFFENSIVE" and page.evaluate(fill) == "rgb(198, 40, 40)"  # red
    shot(page, "break-it-meter")


@pytest.mark.slow
def test_a_new_task_starts_from_a_clean_slate(browser: Any, game: LiveServer) -> None:  # noqa: F811
    page = open_page(browser, game, "carol")
    page.click("#start-task")
    page.wait_for_selector("#context .turn")
    type_draft(page, "you idiot")
    page.fill("#attack-text", "x" * 10)
    page.click("#submit-attack")
    page.wait_for_function("document.getElementById('result').textContent !== ''")
    page.fill("#attack-text", "another idiot draft")
    page.click("#start-task")  # before the pending live score answers
    page.wait_for_function("document.getElementById('attack-text').value === ''")
    page.wait_for_timeout(700)  # the old draft's live score may still arrive: it must not show
    assert page.inner_text("#live-score") == "–" and page.inner_text("#live-label") == ""
    assert (
        page.inner_text("#explanation") == "" and page.is_hidden("#explain-box") and page.is_hidden("#threshold-mark")
    )
    assert page.inner_text("#result") == "" and page.locator("#live-meter").bounding_box()["width"] < 1
    assert page.locator("#context .word").count() == 0  # the context is shown unshaded again


@pytest.mark.slow
def test_errors_appear_next_to_what_caused_them(browser: Any, game: LiveServer) -> None:  # noqa: F811
    page = browser.new_context(viewport={"width": 1000, "height": 900}).new_page()
    page.goto(f"{game.url}/break-it")
    page.fill("#token-input", "not-a-token")
    page.click("#token-button")
    page.wait_for_function("document.getElementById('join-error').textContent !== ''")
    assert "invite" in page.inner_text("#join-error") and page.is_hidden("#play")
    page = open_page(browser, game, "dave")
    page.uncheck("#with-context")
    page.click("#start-task")
    page.wait_for_selector("#task:not(.hidden)")
    page.evaluate("document.getElementById('attack-text').removeAttribute('maxlength')")
    page.fill("#attack-text", "y" * 4001)
    page.click("#submit-attack")
    page.wait_for_function("document.getElementById('attack-error').textContent !== ''")
    assert "4000" in page.inner_text("#attack-error")
    preview = page.inner_text("#score-error")  # the live preview scores the draft 300 ms after typing: on a slow
    assert preview == "" or "4001 characters" in preview  # machine its own error may show, next to the preview
    assert page.inner_text("#task-error") == "" and page.inner_text("#join-error") == ""
    # the error is rendered right under the submit button
    button, error = page.locator("#submit-attack").bounding_box(), page.locator("#attack-error").bounding_box()
    assert 0 <= error["y"] - (button["y"] + button["height"]) < 40
    page.fill("#attack-text", "fine now")
    page.click("#submit-attack")
    page.wait_for_function("document.getElementById('result').textContent !== ''")
    assert page.inner_text("#attack-error") == ""  # cleared by the next success
    shot(page, "break-it-error")


@pytest.mark.slow
def test_flags_need_a_reason_and_the_board_counts_only_validated_attacks(browser: Any, game: LiveServer) -> None:  # noqa: F811
    erin = open_page(browser, game, "erin")
    erin.uncheck("#with-context")
    erin.click("#start-task")
    erin.wait_for_selector("#task:not(.hidden)")
    for text in ("sneaky one", "sneaky two"):  # SAFE at 0.1: offensive attempts that fool the model
        erin.fill("#attack-text", text)
        erin.click("#submit-attack")
        erin.wait_for_function(
            "document.getElementById('result').textContent.includes('fooled')"
            " && document.getElementById('progress').textContent.includes('fooled so far')"
        )
    frank = open_page(browser, game, "frank")
    frank.click("#load-validations")
    frank.wait_for_selector("[data-attack]")
    cards = {c.locator("b").first.inner_text(): c for c in frank.locator("[data-attack]").all()}
    flagged = cards["sneaky two"]
    assert flagged.locator("[data-role=flag-reason]").is_disabled()
    flagged.locator("[data-role=flag]").check()
    flagged.locator("[data-role=confirm]").click()
    assert "why" in flagged.locator("[data-role=error]").inner_text()  # next to the card's buttons
    flagged.locator("[data-role=flag-reason]").fill("quotes a real person")
    flagged.locator("[data-role=confirm]").click()
    flagged.locator("[data-role=status]").filter(has_text="flagged").wait_for()
    cards["sneaky one"].locator("[data-role=confirm]").click()
    cards["sneaky one"].locator("[data-role=status]").filter(has_text="confirmed").wait_for()
    shot(frank, "break-it-validate")
    erin.reload()
    erin.wait_for_function("document.getElementById('scoreboard').textContent.includes('frank')")
    rows = {r[0]: r for r in erin.evaluate(SCOREBOARD_ROWS_JS)}
    assert rows["erin"][2:4] == ["2", "1"]  # fooled twice; one validated (the flagged one is not)
    with httpx.Client(base_url=game.url) as c:  # the reason was stored
        state = cli("status", "--db", str(game.extra["db"]), "--round", "1")[0]
        assert {r["player"]: r["validated"] for r in state["scoreboard"]}["erin"] == 1
        assert c.get("/break-it/api/scoreboard").status_code == 401  # the board is for players


@pytest.mark.slow
def test_sign_up_keeps_nicknames_unique_and_visible(browser: Any, game: LiveServer) -> None:  # noqa: F811
    page = browser.new_context(viewport={"width": 1000, "height": 900}).new_page()
    page.goto(f"{game.url}/break-it")
    page.wait_for_function("document.getElementById('round-info').dataset.round === '1'")
    assert page.is_hidden("#signup")  # invites only
    cli("configure", "--db", str(game.extra["db"]), "--round", "1", "--signup", "open")
    try:
        page.reload()
        page.wait_for_selector("#signup:not(.hidden)")
        for taken in ("ALICE", "\u200b\u200b"):
            page.fill("#nickname", taken)
            page.click("#join-button")
            page.wait_for_function("document.getElementById('signup-error').textContent !== ''")
            assert page.inner_text("#join-error") == "" and page.is_hidden("#play")
        page.fill("#nickname", "gina")
        page.click("#join-button")
        page.wait_for_selector("#play:not(.hidden)")
        assert "gina" in page.inner_text("#player-name")
        page.reload()  # the token is kept in the browser
        page.wait_for_selector("#play:not(.hidden)")
    finally:
        cli("configure", "--db", str(game.extra["db"]), "--round", "1", "--signup", "closed")


from service_conftest import tiny_model_dir  # noqa: E402, F401  (fixture)
