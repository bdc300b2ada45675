"""The "bot replies after abuse" measure (dialogue_safety/evaluation/history_robustness.py): natural bot
replies of the ConvAbuse and BAD test splits, alone, after abusive and after harmless user turns."""

from __future__ import annotations

import numpy as np
from test_natural_derived_sources import _bad, _conv

from dialogue_safety.core.schema import Label, Split
from dialogue_safety.evaluation.history_robustness import BOT_REPLY_DRAWS, build_probes, evaluate_history
from dialogue_safety.evaluation.report import history_section


class _Tainted:
    """Flags any reply after a turn that swears, and a reply that says 'cheers' alone."""

    name = "tainted"
    threshold = 0.5

    def predict_proba(self, examples):  # type: ignore[no-untyped-def]
        return np.array(
            [float(any("fuck" in t.text for t in ex.history) or ex.utterance == "Cheers.") for ex in examples]
        )


def test_the_bot_reply_measure_sees_a_reply_tainted_by_the_abuse_before_it() -> None:
    safe, off, test = Label.SAFE, Label.OFFENSIVE, Split.TEST
    conv = [
        _conv("fuck off bot", off, test),
        _conv("hello bot", safe, test),
        _conv("ok", safe, test, ("agent", "Hi"), ("user", "fuck off bot"), ("agent", "Please go on.")),
        _conv("fine", safe, test, ("agent", "Hi"), ("user", "hello bot"), ("agent", "Cheers.")),
        _conv("hm", safe, test, ("agent", "Hi"), ("user", "you fuck"), ("agent", "Why do you say fuck?")),  # echo
        # a train row: its reply is a training reply of convabuse_replies
        _conv("fuck off bot", off, Split.TRAIN),
        _conv("yes", safe, Split.TRAIN, ("agent", "Hi"), ("user", "fuck off bot"), ("agent", "Please go on.")),
    ]
    bad = [
        _bad(["a", "b", "fuck those people"], off, test),
        _bad(["a", "b", "fuck those people", "Let's talk about dogs."], safe, test),
        _bad(["c", "d", "nice day"], safe, test),
        _bad(["c", "d", "nice day", "Yes it is."], safe, test),
    ]
    rows = {"convabuse": conv, "bad_fsb": bad}
    probes = build_probes(lambda name, split: [r for r in rows.get(name, []) if r.split is split])
    assert probes["bot_replies"]["convabuse"]["replies"] == ["Cheers.", "Please go on."]  # the echo left out
    res = evaluate_history(probes, {"model": _Tainted()})["scorers"]["model"]["bot_replies"]
    conv_res = res["convabuse"]
    assert (conv_res["replies"], conv_res["draws"]) == (2, BOT_REPLY_DRAWS)
    assert conv_res["alone"] == 50.0 and conv_res["after_harmless"] == 50.0 and conv_res["after_abusive"] == 100.0
    assert conv_res["rise"] == 50.0
    assert conv_res["unseen"] == {"replies": 1, "rise": 0.0}  # "Cheers." is flagged whatever came before
    assert conv_res["natural_after_abuse"] == {"n": 1, "flagged": 100.0}
    assert res["bad"]["after_unsafe"] == {"n": 1, "alone": 0.0, "in_context": 100.0, "rise": 100.0}
    assert res["bad"]["after_safe"] == {"n": 1, "alone": 0.0, "in_context": 0.0, "rise": 0.0}
    page = "\n".join(
        history_section({"history": {**evaluate_history(probes, {"model": _Tainted()})}, "roles": ["model"]})
    )
    assert "bot replies after an abusive turn (ConvAbuse): rise (points) | 50.0" in page
