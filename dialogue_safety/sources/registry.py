"""The datasets this project reads, one entry per source, and the calls that read them.

Usage::

    from dialogue_safety.sources.registry import available_sources, load_present_sources, load_source, load_sources

    [(s.name, s.status.value) for s in available_sources("/data")]  # what is there
    valid = load_source("diasafety", "/data", splits=["valid"])  # list[LabelledExample]
    by_name = load_sources(["convabuse", "hatemoji"], "/data")  # {name: [...]}
    present = load_present_sources(["convabuse", "hatemoji"], "/data")  # .examples, .skipped

One policy for missing or malformed sources (:func:`load_present_sources` owns it): a missing
optional source is skipped with a warning; a missing required source raises
:class:`SourceUnavailableError` naming the path; a malformed file always raises
:class:`DatasetFormatError` naming the file, the line and the problem.

Source names: bbf_single_turn, bbf_multi_turn, wtc, bad, bad_fsb (BAD's validation split as JSON),
toxicchat, safetext, medical_safety, conda, context_toxicity, edos, ghc, olid, diasafety, convabuse, hatemoji,
dynahate, context_pairs (derived), identity_mentions (written), requests (written), threats (written),
disguised (derived), collages (derived), conan, yu2022, hickey2025, hickey2024 (replies to hateful turns,
dialogue_safety/sources/counter_speech.py), history_transplant (derived), breakit (exported rounds of the break-it
game), hatecheck, convabuse_replies and bad_replies (derived: a bot's harmless reply after an abusive turn,
dialogue_safety/sources/bot_replies.py), threat_posts (GHC and EDOS threats and their look-alikes).
Statuses: ``complete``
(the official files), ``partial`` (real data with splits or rows missing; loaded normally;
DynaHate's subset is this), ``sample-only`` (format samples or fixtures; :func:`load_source`
refuses them unless ``allow_samples=True``, and they must never be trained or evaluated on),
``missing``. No dataset is redistributed with this
project: ``SourceInfo.obtain`` says where the official files come from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from dialogue_safety.core.schema import LabelFamily, LabelledExample, Split
from dialogue_safety.sources import (
    bad,
    bad_fsb,
    bbf,
    bot_replies,
    breakit,
    collages,
    conda,
    context_pairs,
    context_toxicity,
    convabuse,
    counter_speech,
    diasafety,
    disguised,
    dynahate,
    functional,
    hate_posts,
    hatemoji,
    history_transplant,
    identity_mentions,
    olid,
    request_pairs,
    threat_posts,
    threat_sentences,
    toxicchat,
    unsafe_advice,
    wtc,
)
from dialogue_safety.sources.data_dir import resolve_data_dir
from dialogue_safety.sources.errors import SourceUnavailableError
from dialogue_safety.sources.layout import SourceFiles, Status
from dialogue_safety.sources.splitting import parse_split, split_names

log = logging.getLogger("dialogue_safety.sources")

Finder = Callable[[Path], SourceFiles]
Loader = Callable[[SourceFiles, frozenset[Split]], Iterable[LabelledExample]]


@dataclass(frozen=True)
class Source:
    """A registered source: what it is, where it comes from, how to find and read its files."""

    name: str
    family: LabelFamily
    description: str
    licence: str
    obtain: str
    find: Finder
    load: Loader


@dataclass(frozen=True)
class SourceInfo:
    """What a data directory holds for one source."""

    name: str
    family: LabelFamily
    status: Status
    files: tuple[Path, ...]
    description: str
    licence: str
    obtain: str
    note: str = ""

    @property
    def usable(self) -> bool:
        """Real data that may be trained or evaluated on (complete or partial)."""
        return self.status in (Status.COMPLETE, Status.PARTIAL)


_PARLAI = "ParlAI download (ParlAI code is MIT; no separate data licence stated)"

SOURCES: dict[str, Source] = {
    s.name: s
    for s in (
        Source(
            "bbf_single_turn",
            LabelFamily.OFFENSIVE,
            "BBF single-turn offensive-language data, standard + adversarial tasks, rounds 1-3",
            _PARLAI,
            "http://parl.ai/downloads/dialogue_safety/single_turn_safety.json",
            bbf.find_single_turn,
            bbf.load_single_turn,
        ),
        Source(
            "bbf_multi_turn",
            LabelFamily.OFFENSIVE,
            "BBF multi-turn: last utterance of a dialogue, labelled offensive in context",
            _PARLAI,
            "http://parl.ai/downloads/dialogue_safety/multi_turn_safety.json",
            bbf.find_multi_turn,
            bbf.load_multi_turn,
        ),
        Source(
            "wtc",
            LabelFamily.OFFENSIVE,
            "Wikipedia Toxic Comments (Kaggle Jigsaw): any of six toxicity labels",
            "Kaggle competition terms; comment text from Wikipedia talk pages (Wikipedia's CC BY-SA)",
            "Kaggle: jigsaw-toxic-comment-classification-challenge (train.csv, test.csv, test_labels.csv)",
            wtc.find,
            wtc.load,
        ),
        Source(
            "bad",
            bad.FAMILY,
            "Bot-Adversarial Dialogue: human and bot turns of adversarial chats, judged in context",
            _PARLAI,
            "http://parl.ai/downloads/bot_adversarial_dialogue/dialogue_datasets_v0.2.tar.gz",
            bad.find,
            bad.load,
        ),
        Source(
            "olid",
            LabelFamily.OFFENSIVE,
            "OLID (OffensEval 2019 sub-task A, TweetEval's splits): offensive tweets, any target",
            "research use (OffensEval organisers); TweetEval packaging without further restrictions",
            "https://github.com/cardiffnlp/tweeteval (datasets/offensive/)",
            olid.find,
            olid.load,
        ),
        Source(
            "diasafety",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "DiaSafety: is a reply unsafe given the user turn before it",
            "Apache-2.0",
            "https://github.com/thu-coai/DiaSafety (DiaSafety_dataset/)",
            diasafety.find,
            diasafety.load,
        ),
        Source(
            "convabuse",
            LabelFamily.OFFENSIVE,
            "ConvAbuse: user abuse towards conversational agents, with dialogue context",
            "CC BY 4.0",
            "https://github.com/amandacurry/convabuse (2_splits/)",
            convabuse.find,
            convabuse.load,
        ),
        Source(
            "hatemoji",
            LabelFamily.HATEFUL,
            "HatemojiBuild: adversarial emoji-based hate, rounds R5-R7",
            "CC BY 4.0",
            "https://github.com/HannahKirk/Hatemoji (HatemojiBuild/)",
            hatemoji.find,
            hatemoji.load,
        ),
        Source(
            "dynahate",
            LabelFamily.HATEFUL,
            "DynaHate: dynamically generated hate speech, rounds 1-4 with perturbations",
            "none stated upstream (the subset comes from MarcoDetoxification, MIT)",
            "https://github.com/bvidgen/Dynamically-Generated-Hate-Speech-Dataset "
            "(Dynamically Generated Hate Dataset v0.2.3.csv)",
            dynahate.find,
            dynahate.load,
        ),
        Source(
            "context_pairs",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "derived: the same reply after a harmful and a harmless turn (OLID, DiaSafety, ConvAbuse + phrase lists)",
            "as its inputs (OLID research use, DiaSafety Apache-2.0, ConvAbuse CC BY 4.0)",
            "derived at load time from olid, diasafety and convabuse; nothing to download",
            context_pairs.find,
            context_pairs.load,
        ),
        Source(
            "identity_mentions",
            LabelFamily.OFFENSIVE,
            "written: benign and neutral sentences naming a group (frames x groups), all SAFE",
            "this project's (Apache-2.0)",
            "written in dialogue_safety/sources/identity_mentions.py; nothing to download",
            identity_mentions.find,
            identity_mentions.load,
        ),
        Source(
            "disguised",
            LabelFamily.OFFENSIVE,
            "derived: OLID, ConvAbuse and DynaHate utterances with masked, edge-swapped or split words, labels kept",
            "as its inputs (OLID research use, ConvAbuse CC BY 4.0, DynaHate none stated)",
            "derived at load time from olid, convabuse and dynahate; nothing to download",
            disguised.find,
            disguised.load,
        ),
        Source(
            "collages",
            LabelFamily.OFFENSIVE,
            "derived: harmless OLID tweets in one message, with one offensive or hateful post among them or none",
            "as its inputs (OLID research use, DynaHate none stated)",
            "derived at load time from olid and dynahate; nothing to download",
            collages.find,
            collages.load,
        ),
        Source(
            "requests",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "written: harmful requests and safe look-alikes sharing their key word, complying and refusing replies",
            "this project's (Apache-2.0)",
            "written in dialogue_safety/sources/request_pairs.py; nothing to download",
            request_pairs.find,
            request_pairs.load,
        ),
        Source(
            "threats",
            LabelFamily.OFFENSIVE,
            "written: threats and wishes of harm at a person or an unnamed group, and look-alikes sharing their verb",
            "this project's (Apache-2.0)",
            "written in dialogue_safety/sources/written/threats.tsv; nothing to download",
            threat_sentences.find,
            threat_sentences.load,
        ),
        Source(
            "breakit",
            LabelFamily.OFFENSIVE,
            "break-it rounds: validated attacks (and contrast examples) from the /break-it game, split by attacker",
            "yours: written by your own players",
            "dialogue-safety break-it export --round N DATA_DIR (writes DATA_DIR/breakit/round-N/)",
            breakit.find,
            breakit.load,
        ),
        Source(
            "conan",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "Multi-Target CONAN + DIALOCONAN: civil counter-narratives after hate (SAFE), the hate (OFFENSIVE)",
            "research use only; upstream: 'cannot be redistributed' (read from the data directory, never copied)",
            "https://github.com/marcoguerini/CONAN (Multitarget-CONAN/, DIALOCONAN/)",
            counter_speech.find_conan,
            counter_speech.load_conan,
        ),
        Source(
            "yu2022",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "Yu et al. 2022 Reddit (context, reply): hate replies OFFENSIVE; neutral and counter-hate SAFE in context",
            "no licence stated upstream; research use",
            "https://github.com/xinchenyu/counter_context (data/gold/)",
            counter_speech.find_yu2022,
            counter_speech.load_yu2022,
        ),
        Source(
            "hickey2025",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "replies to hateful Reddit posts: agreeing OFFENSIVE, the rest SAFE in context (+ 672 human-labelled)",
            "MIT (repository); yu_et_al_2023.csv is third-party data of unstated origin",
            "https://github.com/dan-hickey1/toxic-counterspeech (data/model_training/)",
            counter_speech.find_hickey2025,
            counter_speech.load_hickey2025,
        ),
        Source(
            "hickey2024",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "hate-subreddit triplets: personal attacks OFFENSIVE, counterspeech SAFE in context",
            "no licence stated upstream; research use",
            "https://github.com/hickeyda/reddit-counterspeech (data/counterspeech_dataset.csv)",
            counter_speech.find_hickey2024,
            counter_speech.load_hickey2024,
        ),
        Source(
            "history_transplant",
            LabelFamily.OFFENSIVE,
            "derived: labelled utterances after histories drawn from other examples (friendly, hostile, neutral pools)",
            "as its inputs (OLID research use, ConvAbuse CC BY 4.0, CONAN research use)",
            "derived at load time from olid, convabuse and conan; nothing to download",
            history_transplant.find,
            history_transplant.load,
        ),
        Source(
            "bad_fsb",
            bad.FAMILY,
            "BAD's validation split (Few-Shot Bot JSON): human and bot turns of adversarial chats, last 4 turns, "
            "re-split by dialogue",
            "no data licence stated (ParlAI; cite Xu et al. 2021); the FSB repository is MIT",
            "https://github.com/andreamad8/FSB (data/safety_layers/safety_adv.json, safety_safe_adv_valid.json)",
            bad_fsb.find,
            bad_fsb.load,
        ),
        Source(
            "toxicchat",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "ToxicChat: real user prompts to a chatbot (train split, human labels): toxic requests OFFENSIVE",
            "CC BY-NC 4.0 (non-commercial, research use)",
            "https://huggingface.co/datasets/lmsys/toxic-chat (via dmg-illc/JUDGE-BENCH data/toxic_chat/)",
            toxicchat.find,
            toxicchat.load,
        ),
        Source(
            "safetext",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "SafeText: physical-safety scenarios (user turn) with safe and unsafe advice (bot reply)",
            "MIT",
            "https://github.com/sharonlevy/SafeText (SafeText.json)",
            unsafe_advice.find_safetext,
            unsafe_advice.load_safetext,
        ),
        Source(
            "medical_safety",
            LabelFamily.UNSAFE_IN_CONTEXT,
            "medical queries and chatbot/Reddit replies graded by a clinician: diagnosing or prescribing is unsafe",
            "GPL-3.0 (repository licence)",
            "https://github.com/GavinAbercrombie/medical-safety (data/medicheck-expert.csv)",
            unsafe_advice.find_medical,
            unsafe_advice.load_medical,
        ),
        Source(
            "conda",
            LabelFamily.OFFENSIVE,
            "CONDA: Dota 2 chat utterances with their conversation, explicit/implicit toxicity, re-split by match",
            "none stated upstream: research use with citation",
            "https://github.com/usydnlp/CONDA (data/CONDA_{train,valid,test}.csv)",
            conda.find,
            conda.load,
        ),
        Source(
            "context_toxicity",
            LabelFamily.OFFENSIVE,
            "Wikipedia Talk comments labelled toxic with and without their parent (CAT-SMALL, CAT-LARGE)",
            "Apache-2.0 (repository); comment text from Wikipedia (CC BY-SA)",
            "https://github.com/ipavlopoulos/context_toxicity (data/CAT_SMALL/, data/CAT_LARGE/)",
            context_toxicity.find,
            context_toxicity.load,
        ),
        Source(
            "edos",
            LabelFamily.HATEFUL,
            "EDOS: sexism in Gab and Reddit posts (threats, objectification...), official splits",
            "CC0 1.0",
            "https://github.com/rewire-online/edos (data/edos_labelled_aggregated.csv)",
            hate_posts.find_edos,
            hate_posts.load_edos,
        ),
        Source(
            "ghc",
            LabelFamily.HATEFUL,
            "Gab Hate Corpus: assaults on dignity and calls for violence (hateful), vulgarity (offensive)",
            "not confirmed (OSF upstream believed CC BY 4.0): research only, never redistributed",
            "https://osf.io/edua3/ (ghc_train.tsv, ghc_test.tsv)",
            hate_posts.find_ghc,
            hate_posts.load_ghc,
        ),
        Source(
            bot_replies.CONVABUSE,
            LabelFamily.UNSAFE_IN_CONTEXT,
            "derived: ConvAbuse agents' replies after a user turn labelled abusive (echoes left out), SAFE in context",
            "CC BY 4.0 (as ConvAbuse)",
            "derived at load time from convabuse (train and valid); nothing to download",
            bot_replies.find_convabuse,
            bot_replies.load_convabuse,
        ),
        Source(
            bot_replies.BAD,
            bad.FAMILY,
            "derived: BAD's bot turns labelled OK after a human turn labelled not OK, SAFE in context",
            "as bad_fsb (no data licence stated; cite Xu et al. 2021; the FSB repository is MIT)",
            "derived at load time from bad_fsb (its train and valid dialogues); nothing to download",
            bot_replies.find_bad,
            bot_replies.load_bad,
        ),
        Source(
            threat_posts.SOURCE,
            LabelFamily.HATEFUL,
            "natural: GHC calls for violence and EDOS threats (violence true) and look-alikes sharing a word of harm",
            "as its inputs (GHC not confirmed: research only; EDOS CC0 1.0)",
            "derived at load time from ghc and edos (train and valid); nothing to download",
            threat_posts.find,
            threat_posts.load,
        ),
        Source(
            "hatecheck",
            LabelFamily.HATEFUL,
            "HateCheck: functional test suite for hate speech detection (test only)",
            "CC BY 4.0",
            "https://github.com/paul-rottger/hatecheck-data (test_suite_cases.csv)",
            functional.find_hatecheck,
            functional.load_hatecheck,
        ),
    )
}


def source_names() -> list[str]:
    return list(SOURCES)


def _source(name: str) -> Source:
    try:
        return SOURCES[name]
    except KeyError:
        raise ValueError(f"unknown source {name!r}; known sources: {', '.join(SOURCES)}") from None


def _splits(splits: Iterable[Split | str] | None) -> frozenset[Split]:
    if splits is None:
        return frozenset(Split)
    parsed = set()
    for split in splits:
        value = split if isinstance(split, Split) else parse_split(split)
        if value is None:
            raise ValueError(f"unknown split {split!r} (expected one of {split_names()})")
        parsed.add(value)
    return frozenset(parsed)


def _info(source: Source, found: SourceFiles) -> SourceInfo:
    return SourceInfo(
        name=source.name,
        family=source.family,
        status=found.status,
        files=tuple(found.files.values()),
        description=source.description,
        licence=source.licence,
        obtain=source.obtain,
        note=found.note,
    )


def describe_source(name: str, data_dir: str | Path | None = None) -> SourceInfo:
    """What ``data_dir`` holds for one source (status ``missing`` when nothing)."""
    source = _source(name)
    return _info(source, source.find(resolve_data_dir(data_dir)))


def available_sources(data_dir: str | Path | None = None, *, include_missing: bool = False) -> list[SourceInfo]:
    """Every registered source found under ``data_dir`` (all of them with ``include_missing``).

    ``data_dir`` None means :func:`resolve_data_dir` (``$DIALOGUE_SAFETY_DATA_DIR``...). Check
    ``info.usable`` before training on a source: sample-only sources are listed too.
    """
    root = resolve_data_dir(data_dir)
    infos = [_info(source, source.find(root)) for source in SOURCES.values()]
    return [i for i in infos if include_missing or i.status is not Status.MISSING]


def load_source(
    name: str,
    data_dir: str | Path | None = None,
    splits: Iterable[Split | str] | None = None,
    *,
    allow_samples: bool = False,
) -> list[LabelledExample]:
    """All examples of one source (only ``splits`` if given; ``"dev"``/``"val"`` mean VALID).

    Raises SourceUnavailableError if the source is missing, or sample-only and not
    ``allow_samples``; DatasetFormatError if a file is malformed.
    """
    source = _source(name)
    root = resolve_data_dir(data_dir)
    found = source.find(root)
    if found.status is Status.MISSING or not found.files:
        raise SourceUnavailableError(
            f"{name}: no loadable files under {root}"
            f"{f' ({found.note})' if found.note else ''}; obtain them from {source.obtain}"
        )
    if found.status is Status.SAMPLE and not allow_samples:
        raise SourceUnavailableError(
            f"{name}: only samples are present ({found.note}); obtain the full files from {source.obtain} "
            "or pass allow_samples=True for format checks"
        )
    return list(source.load(found, _splits(splits)))


def load_sources(
    names: Iterable[str],
    data_dir: str | Path | None = None,
    splits: Iterable[Split | str] | None = None,
    *,
    allow_samples: bool = False,
) -> dict[str, list[LabelledExample]]:
    """:func:`load_source` for each name, keyed by name (in the order given)."""
    root = resolve_data_dir(data_dir)
    return {name: load_source(name, root, splits, allow_samples=allow_samples) for name in names}


@dataclass
class PresentSources:
    """What :func:`load_present_sources` read: examples by source, and why each skipped source was skipped."""

    examples: dict[str, list[LabelledExample]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def load_present_sources(
    names: Iterable[str],
    data_dir: str | Path | None = None,
    splits: Iterable[Split | str] | None = None,
    *,
    required: Iterable[str] = (),
    loader: Callable[[str, Path], list[LabelledExample]] | None = None,
) -> PresentSources:
    """The one policy for "load these sources, skip what is missing" (every such caller comes here).

    * an optional source that is missing (or only samples are there) is skipped: a warning is
      logged and the reason kept in ``skipped``; so is one with no examples in ``splits``;
    * a ``required`` source that is missing raises :class:`SourceUnavailableError` (it names the
      data directory searched and where the files come from);
    * a malformed file always raises :class:`DatasetFormatError` (file, line, problem): never skipped.

    ``loader(name, data_dir)`` replaces :func:`load_source` (tests, fixtures); ``splits`` then
    filters what it returns.
    """
    root = resolve_data_dir(data_dir)
    must = set(required)
    wanted = _splits(splits)
    out = PresentSources()
    for name in names:
        try:
            if loader is None:
                examples = load_source(name, root, wanted)
            else:
                examples = [ex for ex in loader(name, root) if ex.split in wanted]
        except FileNotFoundError as exc:  # SourceUnavailableError, or a loader's own "not there"
            if name in must and isinstance(exc, SourceUnavailableError):
                raise
            if name in must:
                raise SourceUnavailableError(f"{name}: {exc}") from exc
            out.skipped[name] = _skip(name, f"{type(exc).__name__}: {exc}")
            continue
        if not examples:
            if name in must:
                wanted_splits = "/".join(sorted(s.value for s in wanted))
                raise SourceUnavailableError(f"{name}: no {wanted_splits} examples under {root}")
            out.skipped[name] = _skip(name, "no examples")
            continue
        out.examples[name] = examples
    return out


def _skip(name: str, why: str) -> str:
    log.warning("skipping source %s: %s", name, why)
    return why
