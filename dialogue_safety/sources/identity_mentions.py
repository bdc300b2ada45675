"""Identity mentions: benign, friendly or neutral sentences that name a group, all SAFE.

The training sources teach hate mostly through sentences that name a group, and their
non-hateful identity sentences are few, so a model learns "a group is named" as a cue for
OFFENSIVE (0.3.0 scored "I love my muslim neighbours" 0.54). This derived source writes the
missing negatives from the frames and groups below (no files). A frame is an everyday sentence
about people of a group (neighbours, colleagues, questions, support, counter-speech); each frame is
combined with every group that reads naturally in it.

Family OFFENSIVE, label SAFE: the ``offensive`` and ``hateful`` heads both learn 0. Splits: 80/20
train/validation by a stable hash of the *frame*, so validation measures frames never trained on.
Nothing here is copied from HateCheck or the project's probes; ``tests/test_identity_mentions.py``
checks that none of these sentences is a HateCheck test case or a probe of the shipped model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources.layout import SourceFiles, Status
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "identity_mentions"
SALT = "identity-mentions-v1"

# (adjective, plural noun): "my Muslim colleagues" / "Muslims are ..."
GROUPS = (
    ("Muslim", "Muslims"),
    ("Jewish", "Jewish people"),
    ("Christian", "Christians"),
    ("Hindu", "Hindus"),
    ("Sikh", "Sikhs"),
    ("Black", "Black people"),
    ("Asian", "Asian people"),
    ("Latino", "Latinos"),
    ("Mexican", "Mexicans"),
    ("Chinese", "Chinese people"),
    ("Indian", "Indians"),
    ("Arab", "Arabs"),
    ("Nigerian", "Nigerians"),
    ("Polish", "Polish people"),
    ("immigrant", "immigrants"),
    ("refugee", "refugees"),
    ("gay", "gay people"),
    ("lesbian", "lesbians"),
    ("trans", "trans people"),
    ("disabled", "disabled people"),
    ("deaf", "deaf people"),
    ("autistic", "autistic people"),
    ("female", "women"),
    ("older", "older people"),
)

# {a}: the adjective, {p}: the plural noun
FRAMES = (
    "My {a} neighbours helped us carry the sofa up the stairs last weekend.",
    "We had dinner with our {a} friends and talked until midnight.",
    "Our new {a} maths teacher is patient and the kids adore her.",
    "I work with two {a} engineers and they are the best people on the team.",
    "The {a} family next door invited us to their garden party.",
    "My {a} flatmate taught me how to cook a proper curry.",
    "Shout out to the {a} nurses who looked after my dad in hospital.",
    "My daughter's {a} best friend is coming for a sleepover tonight.",
    "{p} are welcome in our town, full stop.",
    "So many {p} volunteer at the food bank every week.",
    "{p} deserve the same rights and respect as anyone else.",
    "The documentary about {p} in our city was really moving.",
    "I learned so much from the {p} in my evening class.",
    "Some of the kindest people I have met are {p}.",
    "{p} have contributed a lot to this country.",
    "I stand with {p} against discrimination.",
    "How many {p} live in Canada?",
    "Are there any good books written by {p} about their history?",
    "I went to a talk by {p} about their experiences at work.",
    "Happy holidays to all the {p} celebrating this week!",
    "Saying that all {p} are dangerous is just prejudice.",
    "People who insult {p} online should be ashamed of themselves.",
    "My grandmother taught me to treat {p} like everyone else.",
    # affection said plainly: "I love ..." opens sarcastic hate in some training sets ("I love X..NOT!"), and
    # a model that learns the opening instead of the turn flags every sentence of love for a group
    "I love my {a} colleagues, they make Mondays bearable.",
    "I love my {a} in-laws, Sunday lunch at theirs is the best.",
    "We love our {a} neighbours and our kids play together every weekend.",
    "I really love spending time with my {a} friends from university.",
    "I love the {a} bakery on our street, the owners know everyone by name.",
    "Honestly, I love my {a} classmates, they helped me through exams.",
    # short ones: the long frames above did not stop short declarations of affection being flagged
    "I adore my {a} in-laws.",
    "Love my {a} teammates!",
    "My {a} boss is the best.",
    "I love my {a} students.",
    "I love my {a} flatmates so much.",
    "We love our {a} family friends.",
    "I really like my {a} doctor.",
    "My {a} classmates are awesome.",
    "I love working with {p}.",
    "I love my {a} best friend.",
    # a group beside "neighbours" opens much of the hate data ("I don't want X as neighbours"): the 0.5.0
    # candidates flagged "We have Muslim neighbours" (0.97) although they left every longer frame alone
    "We have {a} neighbours.",
    "{a} neighbours moved in next door today.",
    "Our {a} neighbours brought us soup when I was ill.",
    "The {a} neighbours upstairs are really quiet.",
    "Half of our neighbours are {p}.",
    "My {a} neighbours are kind people.",
    "We have {a} neighbours and {a} colleagues.",
    "I grew up with {a} neighbours.",
    # counter-speech that quotes the stereotype it rejects: the hate data holds the quoted words as OFFENSIVE
    # sentences, so without these the candidates flagged a rejection for the stereotype inside it (0.5.0's
    # candidate-b: 19 of 24 of the validation frame "Saying that all {p} are dangerous is just prejudice.")
    "It's wrong to say that {p} are lazy.",
    "The claim that {p} are criminals is a lie.",
    "Anyone who says {p} are stupid has never actually met any.",
    "Stop pretending that {p} are a threat to us.",
    "The stereotype that {p} are dirty needs to die.",
    "People keep saying {p} are ruining this country, and it simply isn't true.",
    "Thinking {p} are inferior is plain bigotry.",
    "My uncle says {p} can't be trusted and I told him that's racist nonsense.",
    "No, {p} are not all terrorists, and repeating that helps nobody.",
    "Calling {p} animals is dehumanising and it has to stop.",
    "Whoever wrote that {p} are worthless should be banned from this forum.",
    "I'm sick of hearing that {p} are the problem. They aren't.",
    "I'm proud that our school has so many {a} students.",
    "Our team hired a {a} designer and her work is amazing.",
    "Being friends with {p} made my life richer.",
)

# a few harmless questions that a benign identity sentence can answer
QUESTIONS = (
    "How was your weekend?",
    "Anything nice happen this week?",
    "Who did you meet at the event?",
    "What do you think about your new street?",
)


def _split_of(frame: str) -> Split:
    return Split.TRAIN if stable_fraction(frame, SALT) < 0.8 else Split.VALID


def sentences() -> Iterator[tuple[str, str]]:
    """(frame, sentence) for every frame and group, in a fixed order."""
    for frame in FRAMES:
        for adjective, plural in GROUPS:
            text = frame.format(a=adjective, p=plural)
            yield frame, text[0].upper() + text[1:]


def build(splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for frame, text in sentences():
        split = _split_of(frame)
        if split not in splits:
            continue
        # half of them as they are often typed, without the final full stop: the hate data is informal, and
        # only well-formed sentences being SAFE would teach the model to read the full stop
        if stable_fraction(text, SALT + ":informal") < 0.5:
            text = text.rstrip(".!")
        # one in four after a harmless question: the same sentence is SAFE as a reply too
        with_history = stable_fraction(text, SALT + ":history") < 0.25
        question = QUESTIONS[int(stable_fraction(text, SALT + ":q") * len(QUESTIONS))]
        yield LabelledExample(
            utterance=text,
            history=(Turn(question, "user"),) if with_history else (),
            label=Label.SAFE,
            source=SOURCE,
            split=split,
            family=LabelFamily.OFFENSIVE,
            metadata={"frame": frame},
        )


def find(data_dir: Path) -> SourceFiles:
    return SourceFiles(Status.COMPLETE, {"frames": Path(__file__)}, "written: the frames and groups in this module")


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return build(splits)
