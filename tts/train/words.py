"""Everyday English vocabulary for the broad teacher corpus (``tts.train.corpus``).

Hand-written lists of common words by part of speech, so the templates that draw from
them stay grammatical: a voice trained on a few hundred words learns those words, not
English, and speaks a new one badly (docs/speech.md). Verbs are ``base:past:participle``
triples where they are irregular, plain base forms where the regular rules make them.
Nothing here is one of the quality report's probe texts (``tts.train.evaluate``); a test
keeps the unseen-words probe's content words out of these lists.
"""

from __future__ import annotations

NOUNS = """
account address afternoon age agreement air airline alarm album answer apartment apple
appointment area arm army article artist attention aunt author baby back bag balance ball
band bank bar bath battle beach bean bear bed bedroom beef bell belt bench bill bird
birthday blade block blood board boat body bone bonus book boot border boss bottom bowl
box boy brain branch bread breakfast brick brother brush bucket budget bug building bus
business butter button cable cafe cake calendar camp car card career carpet cart case cash
castle cat ceiling cell center chain chair chance change channel chapter charge cheese
chef chest chicken child chocolate choice church circle city class classroom client clock
closet cloud club coach coast coat code coffee coin collar college color comment company
concert contract cookie corner cost cotton couch country county couple course cousin cover
cow crew crowd cup customer cycle dad dance danger date daughter deal debt decision degree
delay dentist desk detail device dinner direction dish doctor document dog dollar door
dream dress drink driver drop drum duck dust duty ear earth edge egg election email energy
engineer entrance error evening event exam example exit eye face fact family farm farmer
father fault fence festival field file film finger fire fish flag flight floor flower fly
food foot forest fork form fountain friend fruit fuel future game garage gas gate gift
girl glass glove goal gold grade grass ground group guest guide gym hair hall hand handle
hat head health heart heat hill history hobby hole holiday home honey hook hope horse
hotel hour house husband ice idea image inch income insurance interest internet invoice
iron item jar job joke juice key kid king kitchen knee knife lake land language laptop
law lawyer layer leader leaf lesson level library lid life light line link lion list
loan lock lunch machine mail manager market meal meat medicine member memory menu metal
method middle milk mind minute mistake model moment money monkey month moon morning mother
motor mountain mouse mouth movie music nail name nation neck neighbor nest net news
newspaper night noise nose note number nurse object offer officer oil onion option orange
order owner page pain pair palace pan paper parent park part partner party passenger
password path patient pattern payment peace pen people pepper period person phone photo
piano picture piece pig pilot pin pipe place plan plane plant plate player pocket poem
point police pool post pot potato power present president price prince problem product
program project promise pump queen rabbit race rain range rate reason receipt record
region rent request result rice ring road rock role roof room root rope rule salad salt
sample sand scale scene schedule science score screen sea season seat secret seed sense
service shape sheep shelf shell ship shirt shoe shop shoulder side sign signal silk singer
sister size skill skin sky sleep slice smile snake snow soap soccer sock sofa soil soldier
son song sound soup source space speaker speech speed spoon sport spring square staff
stage stair stamp star steak step stick stomach stone store storm story street student
style subject sugar suit summer sun supper surface sweater system table tail task taste
taxi tea teacher team teeth temple tent term test text theater thing thought throat
tiger time tire toast today toe tomato tongue tool tooth top topic towel town toy track
trade traffic train trip truck trust truth turn uncle unit user vacation van vegetable
video view village visitor voice volume wage wall war watch water wave way wedding week
weekend wheel wife wind wing winter wire wolf woman wood word work worker world writer
yard year yesterday zone
""".split()

ADJECTIVES = """
able active actual afraid alive alone amazing angry annual anxious available aware awful
basic beautiful best better big bitter blank blind blue bold bored brave brief brown busy
central certain cheap chemical chief clean clear close cold comfortable common cool
correct crazy creative cute daily dangerous dark dead dear deep delicious different
difficult direct dirty double dry due early easy effective electric equal exact excellent
excited expensive extra fair false familiar famous fancy fast fat final fine firm flat
foreign formal former free fresh friendly full funny general glad global good grand grateful
great green grey guilty happy hard healthy helpful high historic holy hot huge hungry
important impossible independent inner interesting large late lazy legal light likely
little local lonely long loose loud lovely low lucky mad main major male mental middle
mild minor missing mobile national natural near neat new nice normal obvious odd official
old open orange ordinary original other pale perfect personal pink plain pleasant
popular positive possible powerful practical pretty private proper proud public pure
purple ready real recent red regular relevant rich right round royal rude sad safe same
scared secret serious sharp short shy sick significant silly single slow small smart soft
solid sorry sour special spicy square steady strict strong stupid successful sudden sure
sweet tall terrible thick thin tight total tough traditional true typical ugly unique
unusual upper upset useful usual valid various vast visible warm weak wealthy weird wet
white whole wide willing wise wonderful wooden worried wrong yellow young
""".split()

# base:past:participle where irregular; a plain base takes -ed
VERBS = """
accept add admire agree allow answer apologize appear apply arrange arrive ask attach attend
avoid bake:baked balance begin:began:begun believe belong bend:bent blow:blew:blown boil
book borrow bounce break:broke:broken breathe bring:brought build:built burn buy:bought call
cancel carry catch:caught change charge chase cheer choose:chose:chosen clap climb close
collect comb compare complain complete confirm connect contact copy correct cough count
crash cross cry cut:cut dance decide deliver describe design destroy develop dig:dug
discover discuss divide doubt drag draw:drew:drawn dress drink:drank:drunk
drive:drove:driven drop dry earn eat:ate:eaten enjoy enter escape explain fail
fall:fell:fallen fasten feed:fed feel:felt fetch fill find:found finish fit fix
fly:flew:flown fold follow forget:forgot:forgotten forgive:forgave:forgiven
freeze:froze:frozen gather get:got give:gave:given grab greet grow:grew:grown guess
hang:hung happen hate hear:heard help hide:hid:hidden hit:hit hold:held hope hug hunt hurry
ignore imagine improve include inform insist install invite join joke jump keep:kept kick
kill kiss kneel:knelt knock know:knew:known land last laugh lead:led learn leave:left
lend:lent let:let lie:lay:lain lift like limit listen live load lock look lose:lost love
make:made manage mark marry match matter mean:meant meet:met melt mention mind miss mix move
name need note notice obey offer open order organize own pack paint park pass pause pay:paid
perform phone pick place plan plant play please point pour practice pray prefer:preferred
prepare present press pretend prevent print produce promise protect provide pull punch push
put:put question race rain reach read:read realize receive recognize record reduce refuse
relax release remain remember remind remove rent repeat reply report request rescue rest
return ride:rode:ridden ring:rang:rung rise:rose:risen roll rub run:ran:run rush save
say:said scream search see:saw:seen sell:sold send:sent serve settle shake:shook:shaken
share shave shine:shone shoot:shot shop shout show:showed:shown shut:shut sign
sing:sang:sung sink:sank:sunk sit:sat skip sleep:slept slide:slid smell smile snow solve
sort speak:spoke:spoken spell spend:spent spill split:split spread:spread stand:stood stare
start stay steal:stole:stolen step stir stop store suggest supply support suppose surprise
swim:swam:swum switch take:took:taken talk taste teach:taught tear:tore:torn tell:told thank
think:thought throw:threw:thrown tie touch tour train transfer travel trust try turn type
understand:understood unlock update upload use wait wake:woke:woken walk want warn wash
waste wave wear:wore:worn weigh welcome win:won wish wonder work worry wrap yell
""".split()

ADVERBS = """
again almost already always anyway badly brightly briefly calmly certainly clearly closely
completely correctly daily deeply directly early easily entirely especially exactly
fairly finally firmly freely fully gladly hardly heavily here highly instantly kindly
largely lately later mostly naturally nearly neatly never nicely normally now often only
perfectly perhaps politely probably properly quickly quietly rather really recently
regularly right safely seldom seriously simply slightly slowly smoothly softly sometimes
soon still strongly suddenly surely there today together tomorrow tonight truly usually
very warmly weekly well widely yet
""".split()

NAMES = """
Aaron Abigail Adam Ahmed Aisha Alan Alex Amelia Amir Andrew Angela Anthony Arjun Ava
Barbara Beatrice Benjamin Bianca Brian Caleb Camila Carlos Caroline Charles Charlotte
Chen Christina Claire Daniel Deborah Dmitri Dorothy Edward Eleanor Elijah Ella Emily
Ethan Eva Fatima Fiona Francesca Gabriel George Hannah Harper Hassan Isaac Isabella
Ivan Jacob Jasmine Jennifer Jessica John Jonathan Joseph Joshua Julia Kenji Kevin
Laura Liam Linda Lucas Lucy Luis Madison Maya Megan Mei Michael Mohammed Natalie Nathan
Nicole Nina Oliver Omar Patrick Paul Rachel Rebecca Richard Robert Ryan Samuel Sarah
Sophie Stephen Steven Susan Thomas Timothy Valentina Vincent William Yuki Zara
""".split()

PLACES = """
the park|the airport|the office|the bank|the pharmacy|the supermarket|the train station|
the post office|the dentist|the gym|the cinema|the coffee shop|the hotel lobby|
the parking lot|the front desk|the second floor|the main entrance|the bus stop|
the city center|the university|the hospital|the library|the restaurant|the garden|
the car wash|the shopping mall|the playground|the fire station|the town square|
the conference room|the kitchen|the living room|the basement|the backyard
""".replace("\n", "").split("|")

DAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
WHEN = """
tomorrow|tonight|this afternoon|next week|next month|in ten minutes|in an hour|
later today|on Friday morning|by the end of the day|first thing tomorrow|
early next year|after the meeting|before noon|this weekend|right now|
in a few days|at the end of the month|some time soon
""".replace("\n", "").split("|")
UNITS = (
    "minutes hours days weeks months years dollars euros pounds degrees miles kilometers "
    "meters feet inches kilograms grams liters percent points people items pages steps"
).split()

# Short things an agent or a person says, whole or as the start of a reply.
SHORT = """
Right.|Of course.|Not yet.|Maybe later.|Good morning!|Good evening.|See you soon.|
That works.|Absolutely!|Fair enough.|No problem.|Just a second.|Take care!|Welcome back!|
Really?|Why not?|Great, thanks.|Perfect.|Exactly.|I see.|Understood.|All set.|Done.|
Certainly.|Good night.|Not at all.|Me too.|Nice to meet you.|How are you?|I'm fine.|
Good luck!|Well done!|Congratulations!|Excuse me.|Pardon?|Wait!|Careful!|Hurry up!|
Come in.|Go ahead.|Any time.|You're welcome.|Never mind.|Of course not.|Not really.|
I think so.|I hope so.|I don't know.|Let's go.|Here you are.|There you go.|Cheers!|
Same here.|Why?|Where?|When?|Who?|How?|What?|Which one?|How much?|How long?|
Let me see.|Hang on.|Almost there.|Coming up.|All right.|Good question.|Hold on.|
Yes, please.|No, thanks.|Yes, of course.|No, not yet.|Okay, great.|Sure thing.
""".replace("\n", "").split("|")
INTERJECTIONS = "Oh|Ah|Well|So|Okay|Hey|Alright|Sure|Yes|No|Right|Great|Hmm|Wow".split("|")

IRREGULAR_THIRD = {"fly": "flies", "try": "tries", "cry": "cries", "carry": "carries"}
DOUBLED = {"begin", "forget", "prefer", "permit", "admit"}  # stress on the last syllable
# Nouns that take no "a" and no plural in the templates
UNCOUNTABLE = set(
    """
air blood bread butter cash cheese chocolate coffee cotton dust energy fuel gas gold grass
health heat history honey ice insurance iron juice land meat metal milk money music news
oil pepper rice salt sand science silk sleep snow soap soil staff sugar tea toast traffic
trust truth water wood peace rain speed work danger attention income soccer beef
""".split()
)
COUNTABLE = [n for n in NOUNS if n not in UNCOUNTABLE]


def verb_forms(entry: str) -> tuple[str, str, str, str]:
    """``(base, third person, past, participle)`` of a ``VERBS`` entry."""
    parts = entry.split(":")
    base = parts[0]
    if len(parts) == 1:
        past = _regular_past(base)
        participle = past
    else:
        past = parts[1]
        participle = parts[2] if len(parts) > 2 else past
    return base, _third(base), past, participle


def _regular_past(base: str) -> str:
    if base.endswith("e"):
        return base + "d"
    if base.endswith("y") and base[-2] not in "aeiou":
        return base[:-1] + "ied"
    if _doubles(base):
        return base + base[-1] + "ed"
    return base + "ed"


def _doubles(base: str) -> bool:
    """One-syllable consonant-vowel-consonant verbs double the last letter (stop, plan)."""
    vowels = "aeiou"
    if base in DOUBLED:
        return True
    if len(base) < 3 or base[-1] in vowels + "wxy":
        return False
    if base[-2] not in vowels or base[-3] in vowels:
        return False
    return sum(c in vowels for c in base) == 1


def _third(base: str) -> str:
    if base in IRREGULAR_THIRD:
        return IRREGULAR_THIRD[base]
    if base.endswith(("s", "sh", "ch", "x", "z", "o")):
        return base + "es"
    if base.endswith("y") and base[-2] not in "aeiou":
        return base[:-1] + "ies"
    return base + "s"


def ing(base: str) -> str:
    """The -ing form (regular rules: make -> making, stop -> stopping, lie -> lying)."""
    if base.endswith("ie"):
        return base[:-2] + "ying"
    if base.endswith("e") and not base.endswith(("ee", "ye", "oe")):
        return base[:-1] + "ing"
    if _doubles(base):
        return base + base[-1] + "ing"
    return base + "ing"


def article(word: str) -> str:
    """The article before ``word``, "a" or "an", by its first sound."""
    you = ("use", "uni", "usu", "eu")
    vowel_sound = word[0] in "aeiou" and not word.startswith(you)
    return "an" if vowel_sound or word.startswith(("hour", "honest")) else "a"


def plural(noun: str) -> str:
    irregular = {
        "child": "children", "foot": "feet", "tooth": "teeth", "mouse": "mice",
        "woman": "women", "person": "people", "knife": "knives", "leaf": "leaves",
        "life": "lives", "wife": "wives", "wolf": "wolves", "potato": "potatoes",
        "tomato": "tomatoes", "sheep": "sheep", "fish": "fish", "people": "people",
        "teeth": "teeth", "shelf": "shelves", "news": "news",
    }  # fmt: skip
    if noun in irregular:
        return irregular[noun]
    if noun.endswith(("s", "sh", "ch", "x", "z")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"
