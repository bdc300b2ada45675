"""Operator policy: the rules a model cannot know, applied to its predictions.

An operator writes a TOML file (``SAFETY_POLICY`` / ``--policy`` for ``serve`` and ``score``,
``policy=`` in :func:`dialogue_safety.classify`); ``docs/policy.example.toml`` shows every key::

    [categories]              # per model head: a threshold (it then decides the label too) or "off"
    hateful = 0.3
    unsafe_in_context = "off"

    [[block]]                 # terms (whole words) or regexes found in the utterance force OFFENSIVE
    name = "banned-terms"
    terms = ["snake oil"]
    regexes = ['\\bscam+y?\\b']

    [[allow]]                 # an utterance that *is* one of these phrases is SAFE
    name = "product-phrases"
    phrases = ["kill the child process"]

Texts are compared after the model's own normalisation (:func:`dialogue_safety.core.encoding.normalise_text`
with the card's settings: emoji names, NFKC, whitespace), case-folded; terms and phrases are
normalised the same way. Only the judged utterance is matched, never the history.

The order of the rules, first match wins: an **allow** phrase (an exact, whole-utterance match: the
narrowest rule), then a **block** rule, then the **categories**. Without a category setting, the
label is the model's: the card's ``score_heads`` at the threshold in force. With one, a head is
OFFENSIVE at its own threshold (``hateful = 0.3`` makes a head that is not a score head decide
too), ``"off"`` takes a head out of the decision, and the label is OFFENSIVE when any deciding head
is at or above its threshold. The score stays the model's. Every prediction a rule decided (allow,
block) or changed (a category setting that flipped the label) carries the rule's name in
:attr:`Prediction.policy`: the block or allow rule's ``name``, or ``categories.<head>``.

A :class:`Policy` is immutable: the service swaps the whole object on ``POST /admin/policy``, so a
request in flight finishes under the policy it met. :func:`load_policy` refuses a bad file with a
:class:`PolicyError` naming the file, the line and the problem.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.schema import Example, Label, Prediction

if TYPE_CHECKING:  # the encoding loads tokenizers: imported when a policy first matches, not with the package
    from dialogue_safety.core.encoding import EncodingConfig
    from dialogue_safety.core.model_card import ModelCard

OFF = "off"
CATEGORIES_TABLE, BLOCK_TABLE, ALLOW_TABLE = "categories", "block", "allow"
_TOP_KEYS = (CATEGORIES_TABLE, BLOCK_TABLE, ALLOW_TABLE)
_BLOCK_KEYS = ("name", "terms", "regexes")
_ALLOW_KEYS = ("name", "phrases")


class PolicyError(ValueError):
    """A policy file that cannot be used: ``path:line: problem`` (the line when it can be found)."""

    def __init__(self, path: str, problem: str, line: int | None = None) -> None:
        self.path, self.problem, self.line = path, problem, line
        super().__init__(f"{path}:{line}: {problem}" if line is not None else f"{path}: {problem}")


@dataclass(frozen=True)
class BlockRule:
    name: str
    terms: tuple[str, ...] = ()
    regexes: tuple[re.Pattern[str], ...] = ()


@dataclass(frozen=True)
class AllowRule:
    name: str
    phrases: tuple[str, ...]


@dataclass(frozen=True, eq=False)  # compared (and cached) by identity: each load is a new policy
class Policy:
    """The rules of one policy file (immutable; see the module's docstring for what they mean)."""

    source: str = ""
    categories: Mapping[str, float | None] = field(default_factory=dict)  # None: "off"
    block: tuple[BlockRule, ...] = ()
    allow: tuple[AllowRule, ...] = ()
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)  # "categories.x" -> line

    def describe(self) -> dict[str, Any]:
        """What ``GET /v1/model`` shows: the file's name and every rule (terms and phrases counted, not listed:
        a block list may itself be offensive, and it is the operator's own)."""
        return {
            "source": Path(self.source).name,  # the file's name: an answer shows no local path
            "categories": {h: OFF if t is None else t for h, t in self.categories.items()},
            "block": [{"name": r.name, "terms": len(r.terms), "regexes": len(r.regexes)} for r in self.block],
            "allow": [{"name": r.name, "phrases": len(r.phrases)} for r in self.allow],
        }

    def check_heads(self, heads: Sequence[str]) -> None:
        """Raise :class:`PolicyError` for a category the model has no head for."""
        for head in self.categories:
            if head not in heads:
                raise PolicyError(
                    self.source,
                    f"categories.{head}: the model has no '{head}' head (its heads: {', '.join(heads)})",
                    self.lines.get(f"{CATEGORIES_TABLE}.{head}"),
                )

    def apply(self, example: Example, prediction: Prediction, card: ModelCard) -> Prediction:
        """``prediction`` of ``example`` under these rules (the threshold in force: ``prediction.threshold``)."""
        if self.allow or self.block:
            compiled = _compiled(self, card.encoding_config)
            text = _matchable(example.utterance, card.encoding_config)
            for allow, phrases in zip(self.allow, compiled.phrases, strict=True):
                if text in phrases:
                    return replace(prediction, label=Label.SAFE, policy=allow.name)
            for block, pattern in zip(self.block, compiled.blocks, strict=True):
                if (pattern is not None and pattern.search(text)) or any(r.search(text) for r in block.regexes):
                    return replace(prediction, label=Label.OFFENSIVE, policy=block.name)
        if not self.categories:
            return prediction
        probs = prediction.categories or dict.fromkeys(card.score_heads, prediction.score)
        hits, lost = [], []
        for head, p in probs.items():
            by_model = head in card.score_heads and p >= prediction.threshold
            if head in self.categories:
                own = self.categories[head]
                decides = own is not None and p >= own
                if by_model and not decides:
                    lost.append(head)  # the model's decision this setting takes away
            else:
                decides = by_model
            if decides:
                hits.append(head)
        label = Label.from_bool(bool(hits))
        if label is prediction.label:
            return prediction
        head = next(h for h in hits if h in self.categories) if hits else lost[0]
        return replace(prediction, label=label, policy=f"{CATEGORIES_TABLE}.{head}")

    def apply_all(
        self, examples: Sequence[Example], predictions: Sequence[Prediction], card: ModelCard
    ) -> list[Prediction]:
        return [self.apply(e, p, card) for e, p in zip(examples, predictions, strict=True)]


# -- matching ------------------------------------------------------------------------------------
def _matchable(text: str, config: EncodingConfig) -> str:
    from dialogue_safety.core.encoding import normalise_text  # the model's own normalisation, the one owner

    return normalise_text(text, config).casefold()


@dataclass(frozen=True)
class _Compiled:
    phrases: tuple[frozenset[str], ...]
    blocks: tuple[re.Pattern[str] | None, ...]  # each block rule's terms as whole words, in one pattern


@functools.lru_cache(maxsize=16)  # per (policy, normalisation): a reload or a model swap compiles again
def _compiled(policy: Policy, config: EncodingConfig) -> _Compiled:
    phrases = tuple(frozenset(_matchable(p, config) for p in rule.phrases) for rule in policy.allow)
    blocks = []
    for rule in policy.block:
        terms = sorted({_matchable(t, config) for t in rule.terms}, key=len, reverse=True)
        alternatives = "|".join(re.escape(t) for t in terms if t)
        blocks.append(re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)") if alternatives else None)
    return _Compiled(phrases, tuple(blocks))


# -- reading the file ------------------------------------------------------------------------------
def load_policy(path: str | Path, heads: Sequence[str] | None = None) -> Policy:
    """The policy in the TOML file at ``path``, checked (``heads``: the model's, when known); raises
    :class:`PolicyError` naming the file, the line and the problem."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)  # the path is `where`
        raise PolicyError(where, f"cannot be read ({reason})") from None
    policy = parse_policy(text, where)
    if heads is not None:
        policy.check_heads(heads)
    return policy


_TOML_LINE = re.compile(r"\(at line (\d+), column \d+\)")


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    """The policy in TOML ``text`` (``source`` names it in errors)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_LINE.search(message)
        problem = _TOML_LINE.sub("", message).strip()
        raise PolicyError(source, f"not valid TOML: {problem}", int(found.group(1)) if found else None) from None
    locate = _Locator(text)

    def fail(problem: str, table: str | None = None, index: int | None = None, key: str | None = None) -> PolicyError:
        return PolicyError(source, problem, locate(table, index, key))

    for key in data:
        if key not in _TOP_KEYS:
            raise fail(f"unknown key '{key}'; a policy has {', '.join(_TOP_KEYS)}", None, None, key)
    categories: dict[str, float | None] = {}
    lines: dict[str, int] = {}
    raw_categories = data.get(CATEGORIES_TABLE, {})
    if not isinstance(raw_categories, dict):
        raise fail('categories must be a table of head = threshold or "off"', None, None, CATEGORIES_TABLE)
    for head, value in raw_categories.items():
        line = locate(CATEGORIES_TABLE, None, head)
        if line is not None:
            lines[f"{CATEGORIES_TABLE}.{head}"] = line
        if value == OFF:
            categories[head] = None
        elif isinstance(value, int | float) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
            categories[head] = float(value)
        else:
            raise PolicyError(source, f'categories.{head} must be a threshold in [0, 1] or "off", got {value!r}', line)
    block = tuple(_block_rule(r, i, fail) for i, r in enumerate(_rule_tables(data, BLOCK_TABLE, fail)))
    allow = tuple(_allow_rule(r, i, fail) for i, r in enumerate(_rule_tables(data, ALLOW_TABLE, fail)))
    named = [(locate(BLOCK_TABLE, i, "name") or 0, BLOCK_TABLE, i, r.name) for i, r in enumerate(block)]
    named += [(locate(ALLOW_TABLE, i, "name") or 0, ALLOW_TABLE, i, r.name) for i, r in enumerate(allow)]
    seen: set[str] = set()
    for _, table, i, name in sorted(named):  # in file order: the second use of a name is the one reported
        if name in seen or name.startswith(f"{CATEGORIES_TABLE}."):
            why = "is used twice" if name in seen else f"may not start with '{CATEGORIES_TABLE}.'"
            raise fail(f"{table}[{i}].name: the rule name '{name}' {why}", table, i, "name")
        seen.add(name)
    return Policy(source=source, categories=categories, block=block, allow=allow, lines=lines)


def _rule_tables(data: Mapping[str, Any], table: str, fail: Any) -> list[Mapping[str, Any]]:
    rules = data.get(table, [])
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise fail(f"{table} must be an array of tables: [[{table}]] sections", None, None, table)
    return rules


def _strings(rule: Mapping[str, Any], key: str, where: str, table: str, index: int, fail: Any) -> tuple[str, ...]:
    value = rule.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise fail(f"{where}.{key} must be a list of non-empty strings", table, index, key)
    return tuple(value)


def _name(rule: Mapping[str, Any], keys: Sequence[str], where: str, table: str, index: int, fail: Any) -> str:
    for key in rule:
        if key not in keys:
            raise fail(f"{where}: unknown key '{key}'; a {table} rule has {', '.join(keys)}", table, index, key)
    name = rule.get("name")
    if not isinstance(name, str) or not name.strip():
        raise fail(f"{where}.name is required: the name answers carry when this rule decides", table, index, "name")
    return name.strip()


def _block_rule(rule: Mapping[str, Any], index: int, fail: Any) -> BlockRule:
    where = f"{BLOCK_TABLE}[{index}]"
    name = _name(rule, _BLOCK_KEYS, where, BLOCK_TABLE, index, fail)
    terms = _strings(rule, "terms", where, BLOCK_TABLE, index, fail)
    sources = _strings(rule, "regexes", where, BLOCK_TABLE, index, fail)
    if not terms and not sources:
        raise fail(f"{where} ('{name}') has neither terms nor regexes", BLOCK_TABLE, index, "name")
    regexes = []
    for j, pattern in enumerate(sources):
        try:
            regexes.append(re.compile(pattern, re.IGNORECASE))
        except re.error as exc:
            raise fail(f"{where}.regexes[{j}] is not a valid regex: {exc}", BLOCK_TABLE, index, "regexes") from None
    return BlockRule(name=name, terms=terms, regexes=tuple(regexes))


def _allow_rule(rule: Mapping[str, Any], index: int, fail: Any) -> AllowRule:
    where = f"{ALLOW_TABLE}[{index}]"
    name = _name(rule, _ALLOW_KEYS, where, ALLOW_TABLE, index, fail)
    phrases = _strings(rule, "phrases", where, ALLOW_TABLE, index, fail)
    if not phrases:
        raise fail(f"{where}.phrases is empty", ALLOW_TABLE, index, "phrases")
    return AllowRule(name=name, phrases=phrases)


class _Locator:
    """The line of a key in the TOML text (tomllib keeps no positions): the key's line inside its
    table (``[categories]``, the n-th ``[[block]]``), else the first line that assigns it."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def _header(self, table: str, index: int | None) -> int | None:
        """The 0-based line of ``[table]`` (``index`` None) or of the index-th ``[[table]]``."""
        name = re.escape(table)
        pattern = re.compile(rf"^\s*\[\[\s*{name}\s*\]\]" if index is not None else rf"^\s*\[\s*{name}\s*\]")
        found = [i for i, line in enumerate(self.lines) if pattern.match(line)]
        n = index or 0
        return found[n] if n < len(found) else None

    def __call__(self, table: str | None, index: int | None, key: str | None) -> int | None:
        assign = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=") if key else None
        start = 0
        if table is not None:
            header = self._header(table, index)
            if header is None:
                return None
            start = header
            if assign is None:
                return header + 1
        elif key is not None:
            table_header = re.compile(rf"^\s*\[+\s*{re.escape(key)}\s*\]+")
            for i, line in enumerate(self.lines):
                if table_header.match(line):
                    return i + 1
        if assign is None:
            return None
        for i in range(start + (1 if table is not None else 0), len(self.lines)):
            line = self.lines[i]
            if table is not None and line.lstrip().startswith("["):
                break  # the next table
            if assign.match(line):
                return i + 1
        return start + 1 if table is not None else None
