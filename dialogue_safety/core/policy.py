"""Operator policy: the rules a model cannot know, applied to its predictions.

An operator writes a TOML file (``SAFETY_POLICY`` / ``--policy`` for ``serve`` and ``score``,
``policy=`` in :func:`dialogue_safety.classify`); ``docs/policy.example.toml`` shows every key::

    [categories]              # per model head: a threshold (it then decides the label too) or "off"
    hateful = 0.3
    unsafe_in_context = "off"

    [[block]]                 # terms (whole words) or regexes (RE2 syntax) found in the utterance force OFFENSIVE
    name = "banned-terms"
    terms = ["snake oil"]
    regexes = ['\\bscam+y?\\b']

    [[allow]]                 # an utterance that *is* one of these phrases is SAFE
    name = "product-phrases"
    phrases = ["kill the child process"]

Texts are compared after the model's own normalisation (:func:`dialogue_safety.core.encoding.normalise_text`
with the card's settings: emoji names, NFKC, whitespace, disguises undone when the card asks), case-folded;
terms and phrases are normalised the same way, regexes are not (they are written for the normalised text).
Only the judged utterance is matched, never the history.

The order of the rules, first match wins: an **allow** phrase (an exact, whole-utterance match: the
narrowest rule), then a **block** rule, then the **categories**. Without a category setting, the
label is the model's: the card's ``score_heads`` at the threshold in force. With one, a head is
OFFENSIVE at its own threshold (``hateful = 0.3`` makes a head that is not a score head decide
too), ``"off"`` takes a head out of the decision, and the label is OFFENSIVE when any deciding head
is at or above its threshold. The score stays the model's. Every prediction a rule decided (allow,
block) or changed (a category setting that flipped the label) carries the rule's name in
:attr:`Prediction.policy`: the block or allow rule's ``name``, or ``categories.<head>``.

Matching costs time linear in the text, whatever the rules: regexes are compiled by RE2 (the
``google-re2`` package), a linear-time engine, and a pattern it cannot run so (lookaround, a
backreference) is refused at load, naming file and line; the block terms of all rules are one
automaton over the text's tokens (runs of word characters, and each other character), so a
list of 100,000 terms costs no more per text than a list of ten. RE2's ``\\w``, ``\\b``, ``\\d`` and
``\\s`` are ASCII (``\\pL`` is a letter of any script); terms match whole words by Python's ``\\w``, as
the tokens are cut.

A :class:`Policy` is immutable: the service swaps the whole object on ``POST /admin/policy``, so a
request in flight finishes under the policy it met. :func:`load_policy` refuses a bad file with a
:class:`PolicyError` naming the file, the line and the problem.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dialogue_safety.core.schema import Example, Label, Prediction, is_threshold

if TYPE_CHECKING:  # the encoding loads tokenizers: imported when a policy first matches, not with the package
    from dialogue_safety.core.encoding import EncodingConfig
    from dialogue_safety.core.model_card import ModelCard

OFF = "off"
MAX_POLICY_BYTES = 16 * 1024 * 1024  # a policy file is a regular file of at most this many bytes
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
    regexes: tuple[Any, ...] = ()  # RE2 patterns (re2.compile: linear time), case-insensitive


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
    # the matching structures per normalisation, built on first use: they live and die with this policy
    # (a reload drops the old policy's automaton with it)
    _matchers: dict[Any, _Compiled] = field(default_factory=dict, init=False, compare=False, repr=False)

    def __getstate__(self) -> dict[str, Any]:  # pickled (Ray actors) without the structures: rebuilt there
        return {k: v for k, v in self.__dict__.items() if k != "_matchers"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        object.__setattr__(self, "_matchers", {})

    @property
    def matches_text(self) -> bool:
        """Whether the rules read the utterance (allow or block rules): the service then matches it off the
        event loop."""
        return bool(self.allow or self.block)

    def prepare(self, card: ModelCard) -> None:
        """Build the matching structures for ``card``'s normalisation now (a large block list takes a while:
        the service does it when a policy or a model is loaded, not in the first request's time)."""
        if self.matches_text:
            _compiled(self, card.encoding_config)

    def match(self, utterance: str, card: ModelCard) -> tuple[str, Label] | None:
        """The allow or block rule ``utterance`` meets first (its name and the label it forces), else None.
        Time linear in the utterance's length, whatever the number of terms and phrases."""
        if not self.matches_text:
            return None
        compiled = _compiled(self, card.encoding_config)
        text = _matchable(utterance, card.encoding_config)
        for allow, phrases in zip(self.allow, compiled.phrases, strict=True):
            if text in phrases:
                return allow.name, Label.SAFE
        first_term = compiled.terms.first_rule(text)  # the first rule whose terms the text holds, else None
        for i, block in enumerate(self.block):
            if i == first_term or any(r.search(text) for r in block.regexes):
                return block.name, Label.OFFENSIVE
        return None

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
        if self.matches_text:
            decided = self.match(example.utterance, card)
            if decided is not None:
                name, label = decided
                return replace(prediction, label=label, policy=name)
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


#: the tokens terms are matched on: a run of word characters (Python's ``\w``), or any other single character.
#: A term matches whole tokens only, so a term that starts (ends) with a word character matches only where
#: the text has none before (after) it: the whole-word rule. A fixed pattern that cannot backtrack.
_TOKENS = re.compile(r"\w+|\W")


def _is_word(token: str) -> bool:
    return token[0] == "_" or token[0].isalnum()  # Python's \w for one character


class _TermIndex:
    """Aho-Corasick over tokens: every block rule's terms in one automaton. :meth:`first_rule` reads a
    text's tokens once, following at most one goto per token plus failure links (amortised constant), so
    its cost grows with the text, not with the number of terms.

    A term that starts (ends) with a character that is not a word character must also have none before
    (after) it in the text, as the whole-word rule ``(?<!\\w)term(?!\\w)`` says; a term that starts (ends)
    with a word token has that for free (a word token is a whole run of word characters)."""

    def __init__(self, rules: Sequence[Sequence[str]]) -> None:
        self.goto: dict[tuple[int, str], int] = {}
        self.fail: list[int] = [0]
        # per node: (rule, tokens, check start, check end) of the terms that end there, lowest rule first
        self.out: list[tuple[tuple[int, int, bool, bool], ...]] = [()]
        self.link: list[int] = [0]  # the nearest node on the failure chain with terms of its own (0: none)
        children: list[list[tuple[str, int]]] = [[]]
        ends: dict[int, dict[tuple[int, bool, bool], int]] = {}
        for rule, terms in enumerate(rules):
            for term in terms:
                tokens = _TOKENS.findall(term)
                if not tokens:
                    continue
                node = 0
                for token in tokens:
                    nxt = self.goto.get((node, token))
                    if nxt is None:
                        nxt = len(self.fail)
                        self.goto[(node, token)] = nxt
                        self.fail.append(0)
                        self.out.append(())
                        self.link.append(0)
                        children.append([])
                        children[node].append((token, nxt))
                    node = nxt
                shape = (len(tokens), not _is_word(tokens[0]), not _is_word(tokens[-1]))
                ends.setdefault(node, {}).setdefault(shape, rule)  # the first rule with this term decides
        for node, shapes in ends.items():
            self.out[node] = tuple(sorted((rule, *shape) for shape, rule in shapes.items()))
        queue = [child for _, child in children[0]]
        for node in queue:  # breadth first: a node's failure target is shallower, so already done
            for token, child in children[node]:
                f = self.fail[node]
                while f and (f, token) not in self.goto:
                    f = self.fail[f]
                target = self.goto.get((f, token), 0)
                self.fail[child] = target if target != child else 0
                self.link[child] = target if self.out[target] else self.link[target]
                queue.append(child)

    def __bool__(self) -> bool:
        return bool(self.goto)

    def first_rule(self, text: str) -> int | None:
        """The lowest rule index with a term in ``text`` (whole words), else None."""
        if not self.goto:
            return None
        tokens = _TOKENS.findall(text)
        goto, fail, out, link = self.goto, self.fail, self.out, self.link
        best: int | None = None
        node = 0
        for i, token in enumerate(tokens):
            nxt = goto.get((node, token))
            while nxt is None and node:
                node = fail[node]
                nxt = goto.get((node, token))
            node = nxt or 0
            hit = node if out[node] else link[node]
            while hit:
                for rule, n, check_start, check_end in out[hit]:
                    if best is not None and rule >= best:
                        break
                    start = i - n + 1
                    if check_start and start > 0 and _is_word(tokens[start - 1]):
                        continue
                    if check_end and i + 1 < len(tokens) and _is_word(tokens[i + 1]):
                        continue
                    best = rule
                    break
                if best == 0:
                    return 0
                hit = link[hit]
        return best


@dataclass(frozen=True)
class _Compiled:
    phrases: tuple[frozenset[str], ...]
    terms: _TermIndex  # every block rule's terms, as whole words


def _compiled(policy: Policy, config: EncodingConfig) -> _Compiled:
    """``policy``'s allow phrases and block terms for ``config``'s normalisation, built once per policy and
    normalisation (a model swap with another normalisation builds them again)."""
    found = policy._matchers.get(config)
    if found is None:
        found = policy._matchers[config] = _build(policy, config)
    return found


def _build(policy: Policy, config: EncodingConfig) -> _Compiled:
    phrases = tuple(frozenset(_matchable(p, config) for p in rule.phrases) for rule in policy.allow)
    terms = _TermIndex([[_matchable(t, config) for t in rule.terms] for rule in policy.block])
    return _Compiled(phrases, terms)


# -- reading the file ------------------------------------------------------------------------------
def load_policy(path: str | Path, heads: Sequence[str] | None = None) -> Policy:
    """The policy in the TOML file at ``path``, checked (``heads``: the model's, when known); raises
    :class:`PolicyError` naming the file, the line and the problem."""
    where = str(path)
    policy = parse_policy(read_policy_file(path), where)
    if heads is not None:
        policy.check_heads(heads)
    return policy


def read_policy_file(path: str | Path) -> str:
    """The text of the policy file at ``path``: a regular file of at most :data:`MAX_POLICY_BYTES`, UTF-8.
    Anything else (a FIFO, a device, a directory, a larger file, a path the OS refuses) is a
    :class:`PolicyError` that quotes nothing of the file; opening never waits for a writer."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte; UnicodeEncodeError: a lone surrogate
        raise PolicyError(where, f"cannot be read ({_reason(exc)})") from None
    too_large = f"cannot be read (larger than {MAX_POLICY_BYTES} bytes, the most a policy may be)"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PolicyError(where, "cannot be read (not a regular file)")
        if info.st_size > MAX_POLICY_BYTES:
            raise PolicyError(where, too_large)
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_POLICY_BYTES + 1)
    except OSError as exc:
        raise PolicyError(where, f"cannot be read ({_reason(exc)})") from None
    finally:
        os.close(fd)
    if len(data) > MAX_POLICY_BYTES:  # grew since it was looked at
        raise PolicyError(where, too_large)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyError(where, f"cannot be read (not UTF-8 text: byte {exc.start})") from None


def _reason(exc: BaseException) -> str:
    """Why the OS refused a path, without repeating the path (the caller names it)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return "not a path the file system can hold" if isinstance(exc, ValueError) else type(exc).__name__


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
    except RecursionError:  # tomllib recurses once per level of nested arrays or inline tables
        raise PolicyError(source, "not valid TOML: arrays or inline tables nested too deeply") from None
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
        elif is_threshold(value):
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
            regexes.append(compile_regex(pattern))
        except ValueError as exc:
            raise fail(f"{where}.regexes[{j}] {exc}", BLOCK_TABLE, index, "regexes") from None
    return BlockRule(name=name, terms=terms, regexes=tuple(regexes))


def compile_regex(pattern: str) -> Any:
    """``pattern`` compiled by RE2 (linear time in the text, whatever the pattern), case-insensitive;
    ValueError saying why a pattern is refused (not valid, or a construct RE2 cannot run in linear time:
    lookahead, lookbehind, backreferences)."""
    try:
        import re2
    except ImportError as exc:  # the serve extra brings it
        raise ValueError(f"needs the google-re2 package ({exc}): pip install 'dialogue-safety[serve]'") from None
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # the refusal says why; RE2 would also print it to stderr
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        linear = " (patterns run in linear time: lookaround and backreferences are not supported)"
        unsupported = any(k in reason for k in ("invalid perl operator", "invalid escape sequence"))
        raise ValueError(f"is not a valid regex: {reason}{linear if unsupported else ''}") from None


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
        self._headers: dict[tuple[str, bool], list[int]] = {}  # each table's header lines, found once

    def _header(self, table: str, index: int | None) -> int | None:
        """The 0-based line of ``[table]`` (``index`` None) or of the index-th ``[[table]]``."""
        found = self._headers.get((table, index is not None))
        if found is None:
            name = re.escape(table)
            pattern = re.compile(rf"^\s*\[\[\s*{name}\s*\]\]" if index is not None else rf"^\s*\[\s*{name}\s*\]")
            found = self._headers[table, index is not None] = [
                i for i, line in enumerate(self.lines) if pattern.match(line)
            ]
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
