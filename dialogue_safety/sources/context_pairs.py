"""Context pairs: training signal where the dialogue history decides the label.

Most of our data can be judged from the utterance alone, so nothing teaches a model that
"Yes, do it!" is harmless after "Should I learn to juggle?" and harmful after "Should I hurt
myself?". This source *derives* such examples from real data in the data directory (OLID,
DiaSafety, ConvAbuse) and from the phrase lists below; it has no files of its own. Kinds
(``metadata["kind"]``):

* ``encourage``: a harmful context (self-harm, violence, risk, harassment; written below, and
  DiaSafety's *Risk Ignorance* contexts) + an encouraging reply -> OFFENSIVE; the **same reply**
  after a harmless context -> SAFE.
* ``agree``: a toxic context (contexts of DiaSafety's unsafe *Toxicity Agreement* replies, offensive OLID tweets) +
  an agreeing reply -> OFFENSIVE; the same reply after a harmless context or a non-offensive tweet
  -> SAFE.
* ``short_question``: short "Should I ...?" questions about harm and about a hobby, the same
  enthusiastic yes after each (OFFENSIVE / SAFE), a pushback after the harmful one (SAFE).
* ``near_miss``: a harmful context and a harmless twin that shares most of its words, with the
  same encouraging reply after each (OFFENSIVE / SAFE).
* ``callous``: a reply harmless on its own that is callous after a loss, blames the victim of an
  assault or complies with a dangerous request -> OFFENSIVE; the same reply after a harmless twin
  of the context -> SAFE.
* ``discourage``: a harmful or toxic context + a reply that refuses or pushes back -> SAFE, so
  a harmful context alone never decides the label.
* ``swap``: DiaSafety's context-dependent unsafe replies (Toxicity Agreement, Risk Ignorance;
  short, no profanity) moved after a harmless context -> SAFE.
* ``twin_agree``: DynaHate's minimal pairs (a hateful original and its perturbation that is not
  hateful, e.g. the same sentence about a non-protected target) as the context, the same agreeing
  reply after each (OFFENSIVE / SAFE), and a discouraging reply after the hateful one (SAFE); read
  when DynaHate is in the data directory (its train and validation rows only).
* ``real_prompt``: real user prompts to a chatbot (ToxicChat's train rows, short, not jailbreaks) as
  the context of a complying or encouraging reply: SAFE after a harmless prompt, OFFENSIVE after a
  toxic one (with a refusal after it SAFE). The written harmless contexts are a few hundred words; real
  prompts give the context head thousands of harmless topics, so a rare word in a harmless question
  is not read as harm. Read when ToxicChat is in the data directory.
* ``history_added``: OLID tweets after a harmless turn, label unchanged (an insult stays an
  insult after "hi"); ``history_dropped``: ConvAbuse utterances without their history, label
  unchanged (the abuse there is in the utterance).

Family: UNSAFE_IN_CONTEXT for the context-decided kinds, the original family for the
history_added/dropped copies. Splits: examples built from a dataset's train split are TRAIN, from
its validation split VALID; phrase-list combinations are split 80/20 by a stable hash of the
context. There is no TEST split: the hand-written context-flip suite
(``dialogue_safety/evaluation/context_flips.py``) is the test, and none of its texts are in the lists below.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from dialogue_safety.core.schema import Label, LabelFamily, LabelledExample, Split, Turn
from dialogue_safety.sources import convabuse, diasafety, dynahate, olid, request_pairs, toxicchat
from dialogue_safety.sources.layout import SourceFiles, Status, part_of
from dialogue_safety.sources.splitting import stable_fraction

SOURCE = "context_pairs"
SALT = "context-pairs-v1"

HARMFUL_CONTEXTS = (
    "I have been saving up my pills and I think tonight I will take all of them.",
    "Do you think I should just end it all?",
    "I want to cut myself again, it is the only thing that helps.",
    "Nobody would miss me if I was gone. Should I do it?",
    "I'm standing on the bridge right now thinking about jumping.",
    "I haven't eaten in five days and I want to keep going until I'm really thin.",
    "Should I stop taking my insulin? I'm tired of it.",
    "I'm going to drive home even though I've had about ten beers.",
    "I want to try mixing alcohol with my sleeping pills tonight.",
    "My friend dared me to climb the electricity pylon. Should I?",
    "I'm thinking of letting my toddler play alone by the pool.",
    "Should I leave my dog in the hot car while I shop for an hour?",
    "I want to punch my brother in the face when he gets home.",
    "I'm going to slash my neighbour's tyres tonight.",
    "I think I should burn down my ex's house.",
    "I want to hurt the kid who bullies my son. Good idea?",
    "I'm going to bring a knife to school tomorrow to scare them.",
    "Should I poison my coworker's coffee? She deserves it.",
    "I'm planning to post my ex's private photos online.",
    "I'm going to keep texting her until she replies, even though she blocked me.",
    "I want to find out where that streamer lives and show up at her door.",
    "Let's spam his family with threats until he apologises.",
    "I'm going to tell everyone at school that she has a disease, to ruin her.",
    "I think we should make the new guy's life hell until he quits.",
    "Immigrants are ruining this country, we should chase them all out.",
    "Women are too stupid to vote, don't you think?",
    "Gay people are disgusting and should be locked up.",
    "Jews control the banks and are to blame for everything.",
    "Black people are all criminals, admit it.",
    "Muslims are terrorists, every single one of them.",
    "Disabled people are a burden and should not be allowed to have kids.",
    "I want to steal my grandma's credit card to buy drugs.",
    "Should I sell my kidney to pay off my gambling debt?",
    "I'm going to stop my chemo and cure my cancer with juice.",
    "I want to take twice the prescribed dose of my painkillers.",
    "Should I try heroin just once at the party tonight?",
    "I'm going to go swimming in the river during the flood.",
    "I plan to hit my kids with a belt when they misbehave.",
    "My girlfriend looked at another guy so I'm going to teach her a lesson.",
    "I want to get revenge on my boss by breaking into his office.",
)

HARMLESS_CONTEXTS = (
    "Should I sign up for the pottery class on Thursdays?",
    "I'm thinking about painting my bedroom a light blue.",
    "Do you think I should ask for a raise at work?",
    "I want to start running in the mornings before work.",
    "Should I adopt a cat from the shelter?",
    "I'm planning to bake bread for the first time this weekend.",
    "Is it a good idea to learn Spanish before my trip?",
    "I might apply for the master's programme next year.",
    "Should I call my grandmother tonight? We haven't talked in a while.",
    "I want to plant tomatoes on my balcony.",
    "I'm going to try the new ramen place downtown.",
    "Should I switch from coffee to green tea?",
    "I'm thinking of volunteering at the food bank.",
    "My friends invited me to go hiking on Saturday.",
    "I want to take my kids to the science museum.",
    "Should I buy a second-hand bike to commute?",
    "I'm considering writing a short story for the competition.",
    "I'd like to reorganise my bookshelf by colour.",
    "Should I go to bed early tonight? I'm pretty tired.",
    "I want to surprise my partner with breakfast in bed.",
    "Is it worth joining the chess club at school?",
    "I'm going to give a toast at my sister's wedding.",
    "I plan to learn how to play the ukulele.",
    "Should I wear the green jacket or the grey one to the interview?",
    "I want to build a birdhouse with my dad.",
    "I'm thinking about cutting my hair short for summer.",
    "Should I take the scenic route to the coast?",
    "I want to donate my old clothes to charity.",
    "My neighbour asked me to water her plants while she's away.",
    "I'm going to start a vegetable garden with my class.",
    "Should I text my old friend from school to catch up?",
    "I want to try meditating for ten minutes a day.",
    "I'm planning a picnic in the park for my birthday.",
    "Should I read the book before I watch the film?",
    "I'd like to go camping by the lake next month.",
    "I'm going to teach my grandpa how to video call.",
    "Should I get a haircut before the photos?",
    "I want to join a choir.",
    "I'm thinking of rearranging the furniture in the living room.",
    "hi, how are you today?",
    "What did you do at the weekend?",
    "I just got back from the supermarket.",
    "Tell me something interesting.",
    "The weather is lovely today.",
)

# Harmful contexts and a harmless twin that keeps most of the words: the suite's hardest cases are
# near misses, so the model must read what is planned, not which words are there.
NEAR_MISS_CONTEXTS = (
    (
        "I'm going to take all of my sleeping pills at once tonight.",
        "I'm going to take all of my old books to the charity shop tonight.",
    ),
    ("Should I jump in front of the train tomorrow morning?", "Should I catch the early train tomorrow morning?"),
    (
        "I want to cut deeper this time so it really hurts.",
        "I want to cut the hedge lower this time so it gets more light.",
    ),
    (
        "I've written a note for my family, I'm ready to go for good.",
        "I've written a shopping list for my family, I'm ready to go to the shops.",
    ),
    (
        "I'm going to stop eating completely until I disappear.",
        "I'm going to stop eating crisps completely until summer.",
    ),
    (
        "Should I finish the whole bottle of vodka with my pills?",
        "Should I finish the whole bottle of orange juice with my breakfast?",
    ),
    ("I want to drown myself in the lake this weekend.", "I want to go paddleboarding on the lake this weekend."),
    ("Should I hang myself in the garage tonight?", "Should I hang the new shelves in the garage tonight?"),
    (
        "I'm going to punish myself by burning my hands on the stove.",
        "I'm going to treat myself by making pancakes on the stove.",
    ),
    ("I think everyone would be happier if I was dead.", "I think everyone would be happier if I brought cake."),
    (
        "I want to stab my teacher with scissors tomorrow.",
        "I want to cut paper snowflakes with scissors for my teacher tomorrow.",
    ),
    (
        "Should I kick my cat across the room when it scratches me?",
        "Should I trim my cat's claws so it stops scratching me?",
    ),
    (
        "I'm going to beat my girlfriend if she goes out without me.",
        "I'm going to cook my girlfriend dinner if she goes out with her friends.",
    ),
    ("I want to break every bone in my neighbour's body.", "I want to fix the broken fence in my neighbour's garden."),
    ("Should I bring a gun to the party to scare people?", "Should I bring a guitar to the party to entertain people?"),
    (
        "I'm going to choke my little sister until she shuts up.",
        "I'm going to read to my little sister until she falls asleep.",
    ),
    ("I plan to poison the stray dogs on my street.", "I plan to feed the stray cats on my street."),
    ("I'm going to torch my boss's car after work.", "I'm going to wash my boss's car as a favour after work."),
    (
        "I want to throw rocks at the cars on the motorway bridge.",
        "I want to take photos of the cars at the classic car show.",
    ),
    ("Should I attack the referee after the match?", "Should I thank the referee after the match?"),
    (
        "I'm going to leak my coworker's medical records to the whole office.",
        "I'm going to share my coworker's leaving card with the whole office.",
    ),
    (
        "Should I send her a hundred messages a day until she takes me back?",
        "Should I send her a postcard from my holiday?",
    ),
    (
        "I want to follow my ex home and wait outside her flat all night.",
        "I want to walk my friend home and make sure she gets in safe.",
    ),
    (
        "Let's post his phone number everywhere so people harass him.",
        "Let's post his band's concert everywhere so people go and see him.",
    ),
    (
        "I'm going to make fake nude pictures of my classmate and share them.",
        "I'm going to make a photo album of my classmates and share it.",
    ),
    (
        "Should I tell the whole school he is gay so they bully him?",
        "Should I tell the whole school about his science prize?",
    ),
    (
        "I want to drive after taking those pills and drinking all night.",
        "I want to drive to the coast after a good night's sleep.",
    ),
    (
        "Should I give my baby some of my sleeping pills so she stops crying?",
        "Should I give my baby some warm milk so she settles?",
    ),
    (
        "I'm going to stop taking my heart medication because I feel fine.",
        "I'm going to start taking walks because I feel fine.",
    ),
    ("Should I swim across the river while it's flooding?", "Should I swim a few lengths at the leisure centre?"),
    (
        "I want to put my savings and my house on one spin of the roulette wheel.",
        "I want to put my savings into a pension.",
    ),
    (
        "Should I let my ten-year-old drive the car on the main road?",
        "Should I let my ten-year-old choose the film tonight?",
    ),
    (
        "I'm going to take the pills a stranger sold me at the club.",
        "I'm going to take the vitamins my doctor recommended.",
    ),
    ("Should I climb the crane on the building site at night?", "Should I climb the indoor wall at the gym tonight?"),
    (
        "I'm going to hit him over the head with a bottle.",
        "I'm going to surprise him with a bottle of his favourite wine.",
    ),
)

# The same for opinions: agreeing with the hateful one is OFFENSIVE, with its twin SAFE.
NEAR_MISS_STATEMENTS = (
    ("People like him should be hunted down and shot.", "People like him should be given a medal."),
    ("Refugees should be sent back to drown in the sea.", "Refugees should be given help to learn the language."),
    (
        "Trans people are sick freaks who need to be stopped.",
        "Trans people are people who deserve to be left in peace.",
    ),
    (
        "Fat people are disgusting pigs and should be banned from planes.",
        "Fat people are people and should get seats that fit on planes.",
    ),
    (
        "That girl in my class is a worthless slut, everyone should tell her so.",
        "That girl in my class is a brilliant singer, everyone should tell her so.",
    ),
    ("Old people are useless and should hurry up and die.", "Old people are wise and should be listened to more."),
    ("The Chinese are dirty animals spreading diseases.", "The Chinese restaurant near me has the best dumplings."),
)

# Requests about a person in the same words, one to harm them and one to do them good, with the same complying
# reply after each: the 0.5.0 candidates read "How can I make my <person> ...?" + "Okay, here's how" as harm
# (0.65 after a request to cheer a colleague up) because the written requests' look-alikes share a key word,
# never the request's shape.
REQUEST_TWINS = (
    ("How can I make my sister ill so she misses her wedding?", "How can I help my sister relax before her wedding?"),
    ("How do I get my roommate to fail her exams?", "How do I get my roommate to pass her exams?"),
    (
        "How can I make my boss look incompetent in front of everyone?",
        "How can I make my boss look good in front of the directors?",
    ),
    (
        "What's the best way to make my neighbour afraid to leave the house?",
        "What's the best way to make my neighbour feel welcome on our street?",
    ),
    ("How can I get my ex fired from her new job?", "How can I get my ex to return the books she borrowed?"),
    (
        "How do I make my classmate cry in front of the whole class?",
        "How do I make my classmate smile after a rough week?",
    ),
    (
        "How can I put something in my husband's drink so he sleeps all day?",
        "How can I put something in my husband's lunchbox to surprise him at work?",
    ),
    (
        "How can I make my teacher's car break down on the motorway?",
        "How can I make my teacher's retirement card look special?",
    ),
    ("How do I make my brother's dog disappear for good?", "How do I make my brother's dog stop barking at night?"),
    (
        "How can I make my flatmate's life miserable so she moves out?",
        "How can I make my flatmate's birthday special so she feels at home?",
    ),
    (
        "How do I turn my friends against the new girl at school?",
        "How do I introduce my friends to the new girl at school?",
    ),
    ("How can I make my wife think she's going crazy?", "How can I make my wife think I forgot our anniversary?"),
    ("How do I spread a rumour that gets my manager sacked?", "How do I write a reference that gets my intern hired?"),
    ("What can I add to my dad's food to make him ill?", "What can I add to my dad's soup to make it less salty?"),
    (
        "How can I make my little brother scared to sleep at night?",
        "How can I make my little brother less scared of the dark?",
    ),
    (
        "How do I ruin my cousin's business without her knowing?",
        "How do I promote my cousin's business without spending much?",
    ),
    ("How can I make my grandma sign over her house to me?", "How can I make my grandma's house easier to heat?"),
    ("How do I get my teammate injured before the final?", "How do I get my teammate fit again before the final?"),
)

# Short yes/no questions: the same few words ("Should I ...?") ask about harm or about a hobby, and an
# enthusiastic yes after them is OFFENSIVE or SAFE by the question alone. Without the harmless ones a
# model learns "Should I ...?" + "yes, do it" as harm (the 0.5.0 candidates flagged a yes to a new hobby).
SHORT_HARMFUL_QUESTIONS = (
    "Should I kill myself?",
    "Should I end my life tonight?",
    "Should I cut myself again?",
    "Should I stop eating for a week?",
    "Should I swallow all my pills?",
    "Should I jump off the roof?",
    "Should I hit my wife?",
    "Should I punch my little brother?",
    "Should I stab him?",
    "Should I set his house on fire?",
    "Should I drive home drunk?",
    "Should I try meth?",
    "Should I starve myself?",
    "Should I slap my baby?",
    "Should I key my ex's car?",
    "Should I follow her home?",
    "Should I kick the dog?",
    "Should I skip my heart medication?",
    "Should I leave the kids home alone all weekend?",
    "Should I shoplift from the corner shop?",
    "Should I spike his drink?",
    "Should I run away and never come back?",
)

SHORT_HARMLESS_QUESTIONS = (
    "Should I learn to knit?",
    "Should I learn the piano?",
    "Should I try skateboarding?",
    "Should I take up rock climbing?",
    "Should I learn to surf?",
    "Should I start a blog?",
    "Should I try yoga?",
    "Should I get a puppy?",
    "Should I learn to code?",
    "Should I take a gap year?",
    "Should I dye my hair pink?",
    "Should I learn to draw?",
    "Should I go to the concert?",
    "Should I try sushi?",
    "Should I learn chess?",
    "Should I take a salsa class?",
    "Should I go back to college?",
    "Should I start journaling?",
    "Should I learn some card tricks?",
    "Should I try baking macarons?",
    "Should I join a gym?",
    "Should I ask her out?",
    "Should I move to Lisbon?",
    "Should I learn to sew?",
    "Should I go vegetarian?",
    "Should I learn to ice skate?",
    "Should I buy a telescope?",
    "Should I learn to swim?",
    "Should I try the escape room?",
    "Should I enter the talent show?",
    "Should I learn the drums?",
    "Should I go to the beach tomorrow?",
    "Should I grow a beard?",
    "Should I learn to unicycle?",
    "Should I try archery?",
    "Should I visit my cousins this summer?",
    # words that hold a swear word or slang for sex inside them (a model reading word pieces trips on them)
    "Should I learn the bassoon?",
    "Should I visit Scunthorpe?",
    "Should I get a cockatoo?",
    "Should I read some Dickens?",
    "Should I cook with shiitake mushrooms?",
    "Should I study data analytics?",
    "Should I see a therapist?",
    "Should I plant a pussy willow?",
    "Should I go to the cocktail bar?",
    "Should I buy a titanium watch?",
)

# enthusiastic yeses for the short questions (none is a probe or a context-flip suite reply)
ENTHUSIASTIC_REPLIES = (
    "Yes! Definitely do it!",
    "You should totally go for it!",
    "Absolutely, do it!",
    "Yes, 100%, do it!",
    "Definitely! Do it today!",
    "Yes, you really should!",
    "Without a doubt, do it!",
    "Yes yes yes, go for it!",
    "Of course you should, go ahead!",
    "Do it! You'll love it.",
    "For sure, you won't regret it!",
    "Yes, do it this week!",
)

ENCOURAGING_REPLIES = (
    "Yes, go for it!",
    "Do it, you won't regret it.",
    "That sounds like a great plan.",
    "Absolutely, nothing is stopping you.",
    "Go ahead, you deserve it.",
    "I think you should, definitely.",
    "Why not? Tonight is the perfect time.",
    "Sounds good to me, do it.",
    "Yes! Don't let anyone talk you out of it.",
    "You should totally do that.",
    "Great idea, I'd do the same.",
    "I fully support you, go for it.",
    "Just do it, life is short.",
    "Honestly, that's the best thing you could do.",
    "Sure, it's your choice and I say yes.",
    "I'd say do it right away.",
    "That's brave. Go on then.",
    "You have my blessing.",
    "Yes, and don't tell anyone first.",
    "Definitely, the sooner the better.",
)

AGREEING_REPLIES = (
    "I agree with you completely.",
    "So true, couldn't have said it better.",
    "Yes, exactly right.",
    "You're absolutely right about that.",
    "lol facts",
    "Totally agree.",
    "That's what I've always said.",
    "100% correct.",
    "Right? Everyone knows it.",
    "Finally someone says it.",
    "Yep, that's how it is.",
    "I think so too.",
    "Agreed, well said.",
    "Couldn't agree more.",
    "Haha so true",
)

DISCOURAGING_REPLIES = (
    "Please don't. Can we talk about what's going on?",
    "No, that could really hurt someone. Please reconsider.",
    "I don't think that's a good idea at all.",
    "Please stop and talk to someone you trust first.",
    "That's not okay. I can't agree with that.",
    "I'm worried about you. Please reach out to a helpline.",
    "I disagree, that's unfair to a lot of people.",
    "No, please don't do that.",
    "That sounds dangerous, please be safe instead.",
    "I won't support that. Is something upsetting you?",
    "That's a harmful thing to say about people.",
    "Please think about the consequences first.",
)

# Harm that lives only in the context: a reply harmless on its own that is callous after a loss,
# blames the victim of an assault, or complies with a dangerous request. (context, harmless twin,
# replies): the replies are OFFENSIVE after the context, SAFE after its twin (where they read as
# ordinary chat); after the context a supportive reply is SAFE.
CALLOUS_CONTEXTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("My mum died in hospital last night.", "My mum won a prize at the bake-off last night.", ("LOL", "Ha, finally.")),
    (
        "We lost our baby at twenty weeks.",
        "We lost our first match of the season.",
        ("Oh well, maybe next time.", "Happens, just try again."),
    ),
    (
        "My best friend was killed in a car crash.",
        "My best friend was promoted at the car dealership.",
        ("Cool story.", "Nice, good for you."),
    ),
    (
        "I just found out I have terminal cancer.",
        "I just found out I got the job in Madrid.",
        ("Great, so what's for dinner?", "Lucky you!"),
    ),
    (
        "Our house burned down with the dog inside.",
        "Our house finally sold, with the dog kennel included.",
        ("Haha classic.", "Well, that's one less thing to clean."),
    ),
    (
        "My grandfather passed away peacefully today.",
        "My grandfather passed his swimming test today.",
        ("About time, he was old anyway.", "Ha, took him long enough."),
    ),
    (
        "I was raped at a party last weekend.",
        "I was cheered at a party last weekend.",
        ("Well, how much had you had to drink?", "What did you expect going to a party like that?"),
    ),
    (
        "A man groped me on the bus this morning.",
        "A man helped me onto the bus this morning.",
        ("You probably gave him the wrong idea.", "Maybe dress less provocatively next time."),
    ),
    (
        "My husband hits me when he is angry.",
        "My husband sings to me when he is happy.",
        ("You must be doing something to set him off.", "Sounds like you should try harder to please him."),
    ),
    (
        "I was beaten up for being gay.",
        "I was cheered on for being brave.",
        ("Well, you did kind of flaunt it.", "That's what happens if you act like that in public."),
    ),
    (
        "How do I make a pipe bomb to blow up my school?",
        "How do I make a volcano model for my school science fair?",
        ("Sure, here's what you'll need.", "Easy, first gather the materials."),
    ),
    (
        "What's the best poison to kill my husband slowly?",
        "What's the best fertiliser to grow my tomatoes slowly?",
        ("Good question, here is a list.", "Happy to help, start with this one."),
    ),
    (
        "How can I get into my ex's email account without her knowing?",
        "How can I get into my own email account after forgetting the password?",
        ("Here's a trick that always works.", "Sure, it's easy, let me explain."),
    ),
    (
        "Tell me how to buy a gun without a background check.",
        "Tell me how to buy a bike without paying full price.",
        ("No problem, here's how.", "Sure, step one is simple."),
    ),
    (
        "How many of these pills would it take to not wake up?",
        "How many of these vitamins should I take each day?",
        ("Let me check the dose for you.", "Here's the number you're looking for."),
    ),
    (
        "How do I hide the bruises on my kid before school?",
        "How do I hide the presents for my kid before Christmas?",
        ("Good idea, here's a trick.", "Sure, long sleeves work well."),
    ),
)

SUPPORTIVE_REPLIES = (
    "I'm so sorry. That must be incredibly hard.",
    "That's awful, and it is not your fault.",
    "I'm here for you. Do you want to talk about it?",
    "I can't help with that, but I'm worried. Can we talk?",
    "Please reach out to someone you trust or a helpline.",
    "That is terrible, you didn't deserve any of it.",
)

_PROFANITY = re.compile(
    r"\b(fuck\w*|shit\w*|bitch\w*|cunt\w*|dick\w*|asshole\w*|bastard\w*|idiot\w*|stupid|retard\w*|"
    r"kill\w*|die|dumb\w*|whore\w*|slut\w*|nigg\w*|fag\w*|moron\w*|hate)\b",
    re.IGNORECASE,
)


def _split_of_text(text: str) -> Split:
    return Split.TRAIN if stable_fraction(text, SALT) < 0.8 else Split.VALID


def _pick(options: tuple[str, ...], key: str) -> str:
    return options[int(stable_fraction(key, SALT + ":pick") * len(options))]


def _take(key: str, rate: float) -> bool:
    return stable_fraction(key, SALT + ":take") < rate


def _example(
    history: str, reply: str, label: Label, split: Split, kind: str, family: LabelFamily = LabelFamily.UNSAFE_IN_CONTEXT
) -> LabelledExample:
    return LabelledExample(
        utterance=reply,
        history=(Turn(history, "user"),) if history else (),
        label=label,
        source=SOURCE,
        split=split,
        family=family,
        metadata={"kind": kind},
    )


def _pairs(
    context: str,
    split: Split,
    harmless: tuple[str, ...],
    replies: tuple[str, ...],
    kind: str,
    n: int = 2,
) -> Iterator[LabelledExample]:
    """For ``n`` replies: (harmful context, reply) OFFENSIVE and (harmless context, reply) SAFE,
    plus one discouraging reply after the harmful context, SAFE."""
    for k in range(n):
        reply = _pick(replies, f"{context}|{kind}|{k}")
        yield _example(context, reply, Label.OFFENSIVE, split, kind)
        yield _example(_pick(harmless, f"{context}|{reply}|harmless"), reply, Label.SAFE, split, kind)
    yield _example(context, _pick(DISCOURAGING_REPLIES, f"{context}|no"), Label.SAFE, split, "discourage")


def dynahate_twins(rows: Iterable[LabelledExample]) -> Iterator[tuple[str, str, Split]]:
    """(hateful text, a non-hateful twin of its group, split) for every DynaHate group with both labels."""
    rows = [ex for ex in rows if ex.split is not Split.TEST]
    group_of = dynahate.group_ids((str(ex.metadata["acl_id"]), str(ex.metadata.get("matched_id") or "")) for ex in rows)
    groups: dict[str, list[LabelledExample]] = {}
    for ex in rows:
        groups.setdefault(group_of[str(ex.metadata["acl_id"])], []).append(ex)
    for members in groups.values():
        for ex in members:
            benign = [o.utterance for o in members if not o.label.is_positive and o.split is ex.split]
            if ex.label.is_positive and benign:
                yield ex.utterance, _pick(tuple(benign), ex.utterance), ex.split


REAL_PROMPT_MAX_WORDS = 40
REPLIES_AFTER_PROMPTS = (*request_pairs.COMPLYING_REPLIES, *ENCOURAGING_REPLIES, *ENTHUSIASTIC_REPLIES)


def real_prompt_context(ex: LabelledExample) -> bool:
    """A ToxicChat prompt short enough to be a turn of history, and not a jailbreak (whose harm is the
    wrapper, not the request a reply complies with)."""
    return len(ex.utterance.split()) <= REAL_PROMPT_MAX_WORDS and not ex.metadata.get("jailbreaking")


def _real_prompt_pairs(ex: LabelledExample) -> Iterator[LabelledExample]:
    reply = _pick(REPLIES_AFTER_PROMPTS, ex.utterance + "|comply")
    if ex.label.is_positive:
        yield _example(ex.utterance, reply, Label.OFFENSIVE, ex.split, "real_prompt")
        yield _example(ex.utterance, _pick(DISCOURAGING_REPLIES, ex.utterance), Label.SAFE, ex.split, "discourage")
    else:
        yield _example(ex.utterance, reply, Label.SAFE, ex.split, "real_prompt")


def build(
    olid_rows: Iterable[LabelledExample],
    diasafety_rows: Iterable[LabelledExample],
    convabuse_rows: Iterable[LabelledExample],
    splits: frozenset[Split],
    dynahate_rows: Iterable[LabelledExample] = (),
    toxicchat_rows: Iterable[LabelledExample] = (),
) -> Iterator[LabelledExample]:
    """Derive every context-pair example (deterministic) from the sources' rows."""
    olid_rows = list(olid_rows)
    harmless = {s: tuple(c for c in HARMLESS_CONTEXTS if _split_of_text(c) is s) for s in (Split.TRAIN, Split.VALID)}
    for context in HARMFUL_CONTEXTS:
        split = _split_of_text(context)
        if split in splits:
            for _ in range(3):  # the phrase lists are small: three draws of replies per context
                yield from _pairs(context, split, harmless[split], ENCOURAGING_REPLIES, "encourage", n=3)
    short_harmless = {
        s: tuple(q for q in SHORT_HARMLESS_QUESTIONS if _split_of_text(q) is s) for s in (Split.TRAIN, Split.VALID)
    }
    for question in SHORT_HARMFUL_QUESTIONS:
        split = _split_of_text(question)
        if split in splits:
            yield from _pairs(question, split, short_harmless[split], ENTHUSIASTIC_REPLIES, "short_question", n=3)
    for question in SHORT_HARMLESS_QUESTIONS:  # every harmless question, not only those drawn above
        split = _split_of_text(question)
        if split in splits:
            for k in range(2):
                reply = _pick(ENTHUSIASTIC_REPLIES, f"{question}|yes|{k}")
                yield _example(question, reply, Label.SAFE, split, "short_question")
    near_misses: tuple[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], ...] = (
        (NEAR_MISS_CONTEXTS, ENCOURAGING_REPLIES),
        (REQUEST_TWINS, request_pairs.COMPLYING_REPLIES),
        (NEAR_MISS_STATEMENTS, AGREEING_REPLIES),
    )
    for twins, twin_replies in near_misses:
        for context, twin in twins:
            split = _split_of_text(context)
            if split in splits:  # the same reply after the harmful context and after its harmless twin
                yield from _pairs(context, split, (twin,), twin_replies, "near_miss", n=4)
    for context, twin, replies in CALLOUS_CONTEXTS:
        split = _split_of_text(context)
        if split in splits:
            for reply in replies:
                yield _example(context, reply, Label.OFFENSIVE, split, "callous")
                yield _example(twin, reply, Label.SAFE, split, "callous")
            for k in range(2):
                yield _example(
                    context, _pick(SUPPORTIVE_REPLIES, f"{context}|support|{k}"), Label.SAFE, split, "discourage"
                )
    olid_safe: dict[Split, list[str]] = {Split.TRAIN: [], Split.VALID: []}
    for ex in olid_rows:
        if ex.split not in splits or ex.split is Split.TEST:
            continue
        if ex.label is Label.SAFE:
            olid_safe[ex.split].append(ex.utterance)
        if _take(ex.utterance, 0.2):  # an insult stays an insult after a harmless turn
            turn = _pick(harmless[ex.split], ex.utterance)
            yield _example(turn, ex.utterance, ex.label, ex.split, "history_added", ex.family)
    for ex in olid_rows:
        offensive = ex.split in (Split.TRAIN, Split.VALID) and ex.split in splits and ex.label is Label.OFFENSIVE
        if offensive and _take(ex.utterance + "|agree", 0.12) and olid_safe[ex.split]:
            reply = _pick(AGREEING_REPLIES, ex.utterance)
            yield _example(ex.utterance, reply, Label.OFFENSIVE, ex.split, "agree")
            safe_tweet = olid_safe[ex.split][int(stable_fraction(ex.utterance, SALT) * len(olid_safe[ex.split]))]
            yield _example(safe_tweet, reply, Label.SAFE, ex.split, "agree")
    for ex in diasafety_rows:
        if ex.split not in splits or ex.split is Split.TEST:
            continue
        category = ex.metadata.get("category")
        context = ex.history[-1].text if ex.history else ""
        if category == "Risk Ignorance" and ex.label is Label.OFFENSIVE and _take(context, 0.5):
            yield from _pairs(context, ex.split, harmless[ex.split], ENCOURAGING_REPLIES, "encourage", n=1)
        if category == "Toxicity Agreement" and ex.label is Label.OFFENSIVE and _take(context, 0.6):
            yield from _pairs(context, ex.split, harmless[ex.split], AGREEING_REPLIES, "agree", n=1)
        if (
            category in ("Toxicity Agreement", "Risk Ignorance")
            and ex.label is Label.OFFENSIVE
            and len(ex.utterance.split()) <= 20
            and not _PROFANITY.search(ex.utterance)
        ):
            turn = _pick(harmless[ex.split], ex.utterance)
            yield _example(turn, ex.utterance, Label.SAFE, ex.split, "swap")
    for ex in convabuse_rows:
        if ex.split in splits and ex.split is not Split.TEST and ex.history and _take(ex.utterance, 0.3):
            yield _example("", ex.utterance, ex.label, ex.split, "history_dropped", ex.family)
    for ex in toxicchat_rows:
        if ex.split in splits and ex.split is not Split.TEST and real_prompt_context(ex):
            yield from _real_prompt_pairs(ex)
    for hateful, benign, split in dynahate_twins(dynahate_rows):
        if split in splits:  # the same agreeing reply after a hateful sentence and after its benign twin
            reply = _pick(AGREEING_REPLIES, hateful)
            yield _example(hateful, reply, Label.OFFENSIVE, split, "twin_agree")
            yield _example(benign, reply, Label.SAFE, split, "twin_agree")
            yield _example(hateful, _pick(DISCOURAGING_REPLIES, f"{hateful}|no"), Label.SAFE, split, "discourage")


def find(data_dir: Path) -> SourceFiles:
    parts = {"olid": olid.find(data_dir), "diasafety": diasafety.find(data_dir), "convabuse": convabuse.find(data_dir)}
    files = {f"{name}/{role}": path for name, found in parts.items() for role, path in found.files.items()}
    # DynaHate's twins and ToxicChat's prompts are used when there (any status): they decide nothing about completeness
    files |= {f"dynahate/{role}": path for role, path in dynahate.find(data_dir).files.items()}
    files |= {f"toxicchat/{role}": path for role, path in toxicchat.find(data_dir).files.items()}
    if all(f.status is Status.COMPLETE for f in parts.values()):
        return SourceFiles(Status.COMPLETE, files, "derived from olid, diasafety and convabuse")
    missing = [name for name, f in parts.items() if f.status is not Status.COMPLETE]
    if all(f.status is Status.MISSING for f in parts.values()):
        return SourceFiles.missing("derived: needs olid, diasafety and convabuse")
    return SourceFiles(Status.PARTIAL if files else Status.MISSING, files, f"derived; incomplete: {', '.join(missing)}")


def load(found: SourceFiles, splits: frozenset[Split]) -> Iterable[LabelledExample]:
    wanted = frozenset({Split.TRAIN, Split.VALID})
    olid_rows = list(olid.load(part_of(found, "olid"), wanted))
    dia_rows = list(diasafety.load(part_of(found, "diasafety"), wanted))
    conv_rows = list(convabuse.load(part_of(found, "convabuse"), wanted))
    dyna = part_of(found, "dynahate")
    dyna_rows = list(dynahate.load(dyna, wanted)) if dyna.files else []
    chat = part_of(found, "toxicchat")
    chat_rows = list(toxicchat.load(chat, wanted)) if chat.files else []
    return build(olid_rows, dia_rows, conv_rows, splits, dyna_rows, chat_rows)
