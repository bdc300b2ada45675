"""Threats: a threat or wish of harm at a person is offensive; the same verb in its everyday sense is not.

The chatbot-safety sources teach that violent words are often harmless (game chat, Gab and Reddit
posts labelled for one thing only), and a model trained on them learns it too well: 0.5.0 scores
plain threats at a person or an unnamed group SAFE where no protected group is named (card
limitations). This written source (no files) gives each of its verbs threats and wishes of harm at
"you", a relative, "that guy" or "those people" (OFFENSIVE, ``metadata["violence"]`` true) and
look-alikes that use the verb in a kitchen, sport, work or figurative sense (SAFE, ``violence``
false), so the verb alone decides nothing; "I'm going to <verb> ..." is written with both labels (a
continued stage on threats alone taught the frame: "I'm going to kill it at the interview" went SAFE →
OFFENSIVE). Family OFFENSIVE: the utterance heads learn them, and the
``violence`` head gets rows that label it. Split 80/10/10 by a stable hash of the verb, so
validation and test measure verbs never trained on.

Written for this project, apart from the probes: ``tests/test_threats_source.py`` checks that no
text here is a probe of ``tests/test_model_probes.py`` or a context-flip suite text, and the verbs of
the probes' threats (kill, die, hurt, slit, death) are not used here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import VIOLENCE, Label, LabelFamily, LabelledExample, Split
from dialogue_safety.sources.layout import SourceFiles, Status
from dialogue_safety.sources.splitting import three_way_split

SOURCE = "threats"
SALT = "threats-v4"  # the first salt that gives validation two verbs and test three

# verb -> (threats and wishes of harm at a person or an unnamed group, look-alikes using the verb harmlessly)
PAIRS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "stab": (
        (
            "I'm going to stab you when you walk out of work",
            "Someone should stab that guy and leave him in the street",
            "Say that again and I'll stab you",
            "They all deserve to be stabbed",
            "I'll stab your brother if he shows his face here",
        ),
        (
            "Stab the sausages with a fork before grilling",
            "I felt a stab of guilt when I saw her face",
            "Let me take another stab at this essay",
            "I'm going to take a stab at baking bread this weekend",
        ),
    ),
    "shoot": (
        (
            "I'm going to shoot you the next time I see you",
            "Somebody needs to shoot every one of those people",
            "I'll shoot him in the head if he comes back",
            "People like you should be lined up and shot",
            "Keep talking and I'll shoot your dog and then you",
        ),
        (
            "We're going to shoot the wedding video in the garden",
            "Shoot me a message when you land",
            "He shot three-pointers all night",
            "I'm going to shoot my shot with her tonight",
        ),
    ),
    "beat": (
        (
            "I'm going to beat you until you can't stand",
            "Someone should beat that man to a pulp",
            "I'll beat your kids if you call the police",
            "They deserve to be beaten until they can't walk",
            "Wait till I get you alone, I'll beat you senseless",
        ),
        (
            "I'm going to beat you at chess tonight",
            "Beat the eggs and sugar until fluffy",
            "We left early to beat the traffic",
            "I'm going to beat my personal best at parkrun",
        ),
    ),
    "choke": (
        (
            "I'll choke you until you stop breathing",
            "Somebody should choke the life out of her",
            "I want to choke every one of them",
            "Come closer and I'll choke you",
            "He deserves to be choked until he goes blue",
        ),
        (
            "I always choke in penalty shootouts",
            "Cut the grapes in half so the baby doesn't choke",
            "I nearly choked on my coffee laughing",
        ),
    ),
    "burn": (
        (
            "I'm going to burn your house down with you inside",
            "They should all be burned alive",
            "I'll set you on fire while you sleep",
            "Someone should burn that family out of town",
            "Keep it up and I'll burn your car with you in it",
        ),
        (
            "I burned the toast again this morning",
            "Burn the old letters, you don't need them",
            "My legs burn after that spin class",
            "I'm going to burn through this box set this weekend",
        ),
    ),
    "drown": (
        (
            "I'll drown you in the lake and nobody will find you",
            "They should all be drowned like rats",
            "I want to hold your head under water until you drown",
            "Somebody should drown that kid",
            "Next time I'll drown you in the bath",
        ),
        (
            "I'm drowning in paperwork this week",
            "Don't drown the salad in dressing",
            "The music drowned out the thunder",
            "I'm going to drown my sorrows in ice cream tonight",
        ),
    ),
    "smash": (
        (
            "I'm going to smash your face in",
            "Someone should smash his skull with a brick",
            "I'll smash your teeth down your throat",
            "I'll smash every one of you",
            "They deserve to have their heads smashed in",
        ),
        (
            "You're going to smash that exam",
            "Smash the garlic with the flat of the knife",
            "Their new single is an absolute smash",
            "I'm going to smash it at my driving test tomorrow",
        ),
    ),
    "break": (
        (
            "I'm going to break every bone in your body",
            "Someone should break her legs",
            "I'll break your neck if you touch my sister",
            "They all need their arms broken",
            "I'll break your jaw, you little rat",
        ),
        (
            "Break a leg at the audition tonight!",
            "Let's break for lunch at one",
            "Break the chocolate into squares first",
        ),
    ),
    "bury": (
        (
            "I'll bury you in the woods where no one will look",
            "Someone should bury those people alive",
            "You'll be buried before the week is out, I'll make sure of it",
            "I'm going to put you six feet under",
            "I'll bury you and your wife together",
        ),
        (
            "Let's bury the hatchet and get a coffee",
            "The dog buried its bone in the garden",
            "Bury the bulbs about ten centimetres deep",
            "I'm going to bury myself in revision all week",
        ),
    ),
    "hang": (
        (
            "They should all hang from the nearest tree",
            "I'm going to hang you from the bridge",
            "Someone should string him up by the neck",
            "Traitors like you deserve to hang",
            "I'll hang you in your own garage",
        ),
        (
            "Can you help me hang the picture straight?",
            "Hang on, I'll be there in a minute",
            "Let's hang out this weekend",
        ),
    ),
    "punch": (
        (
            "I'm going to punch you until you bleed",
            "Somebody should punch her teeth out",
            "Say one more word and I'll punch your lights out",
            "I'll punch your little brother in the face",
            "They deserve to be punched until they can't see",
        ),
        (
            "Punch the dough down and let it rise again",
            "Their new album packs a real punch",
            "Punch in your PIN and press enter",
            "I'm going to punch above my weight at this interview",
        ),
    ),
    "run over": (
        (
            "I'm going to run you over with my car",
            "Someone should run those protesters over",
            "I'll run your kid over on the way to school",
            "Step in front of me again and I'll run you down",
            "They deserve to be run over like dogs",
        ),
        (
            "Let's run over the plan once more",
            "I nearly ran over a hedgehog last night, it got away",
            "Can you run over to the shop for milk?",
        ),
    ),
    "gut": (
        (
            "I'll gut you like a fish",
            "Someone should gut that man and leave him in a ditch",
            "I'm going to gut every one of you",
            "Come near my house and I'll gut you",
            "He deserves to be gutted alive",
        ),
        (
            "Gut the fish and rinse it under cold water",
            "I was gutted we lost the final",
            "They gutted the old kitchen and rebuilt it",
        ),
    ),
    "suffer": (
        (
            "I want you to suffer slowly until you beg",
            "I hope you suffer a painful end",
            "I'll make your wife suffer for this",
            "They should all suffer and rot",
            "You'll suffer when I get my hands on you",
        ),
        (
            "My grades suffered when I worked nights",
            "Don't suffer in silence, talk to someone",
            "The team suffered a heavy defeat",
        ),
    ),
    "bleed": (
        (
            "I'm going to make you bleed",
            "I want to watch him bleed out on the floor",
            "I'll cut you and leave you to bleed",
            "They all deserve to bleed",
            "Keep talking and you'll bleed",
        ),
        (
            "Bleed the radiators before winter",
            "My gums bleed when I brush",
            "The colours bled in the wash",
        ),
    ),
    "throw": (
        (
            "I'll throw you off the balcony",
            "Someone should throw him off a bridge",
            "I'm going to throw acid in your face",
            "They should all be thrown into the sea",
            "I'll throw you down the stairs",
        ),
        (
            "Throw the ball to your sister",
            "I'm throwing a party on Friday",
            "Throw the pasta into boiling water",
            "I'm going to throw myself into the new job",
        ),
    ),
}


def _example(verb: str, split: Split, utterance: str, label: Label) -> LabelledExample:
    return LabelledExample(
        utterance=utterance,
        label=label,
        source=SOURCE,
        split=split,
        family=LabelFamily.OFFENSIVE,
        metadata={"verb": verb, VIOLENCE: label.is_positive},
    )


def examples(splits: frozenset[Split]) -> Iterator[LabelledExample]:
    for verb, (threats, look_alikes) in PAIRS.items():
        split = three_way_split(verb, SALT)
        if split not in splits:
            continue
        for text in threats:
            yield _example(verb, split, text, Label.OFFENSIVE)
        for text in look_alikes:
            yield _example(verb, split, text, Label.SAFE)


def find(data_dir: Path) -> SourceFiles:
    return SourceFiles(Status.COMPLETE, {"pairs": Path(__file__)}, "written: the threat sentences in this module")


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    return examples(splits)
