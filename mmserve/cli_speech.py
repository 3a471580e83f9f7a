"""Speech subcommands: ``mmserve say | voices | voice train | voice eval``.

Registered on ``mmserve.cli``'s table like every subcommand; ``mmserve serve`` takes the
``SpeechConfig`` flags (``--voice``, ``--snac``, ...) beside the engine's and server's.
"""

from __future__ import annotations

import argparse
import sys

from mmserve.cli import config_from, dataclass_flags, subcommand


def _voice_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--voice",
        default="default",
        help="'default' (shipped) or a voice directory (an Orpheus checkpoint "
        "with its SNAC decoder in <dir>/snac, or a trained voice)",
    )
    parser.add_argument("--snac", default=None, help="an Orpheus voice's SNAC decoder dir")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda")


def _say_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", help="what to say ('-' reads standard input)")
    parser.add_argument(
        "--out",
        default="speech.wav",
        help="output file; its suffix picks the format (.wav, .flac, .ogg)",
    )
    parser.add_argument(
        "--speaker",
        default=None,
        help="a speaker of a multi-speaker voice (Orpheus: tara, leo, ...)",
    )
    _voice_flags(parser)


@subcommand("say", "speak text into an audio file with a voice (no server)", _say_flags)
def say(args: argparse.Namespace) -> int:
    from tts.synthesizer import Synthesizer

    text = sys.stdin.read() if args.text == "-" else args.text
    synth = Synthesizer(args.voice, args.device, args.snac)
    path = synth.save(text, args.out, args.speaker)
    import soundfile

    info = soundfile.info(str(path))
    print(f"wrote {path}: {info.duration:.2f} s at {info.samplerate} Hz")
    return 0


@subcommand("voices", "list the voice names a server with this voice answers to", _voice_flags)
def voices(args: argparse.Namespace) -> int:
    from tts.registry import VoiceRegistry, load

    voice = load(args.voice, args.snac)
    print(f"voice {voice.name} ({type(voice).__name__}) from {voice.model_dir}")
    for name, target in VoiceRegistry(voice).table():
        print(f"  {name:<10} -> {target}")
    return 0


def _voice_cmd_flags(parser: argparse.ArgumentParser) -> None:
    from tts.train.recipe import VoiceTrainConfig

    parser.add_argument(
        "action",
        choices=("train", "eval"),
        help="train: the default voice, from espeak-ng teacher data, in "
        "resumable stages; eval: its quality report on held-out sentences",
    )
    dataclass_flags(VoiceTrainConfig)(parser)
    parser.add_argument(
        "--voice",
        default=None,
        help="eval: the voice directory to score (default: the shipped one)",
    )
    parser.add_argument(
        "--report", default="bench/out/voice", help="eval: where the JSON and spectrogram PNGs go"
    )
    parser.add_argument(
        "--eval-sentences", type=int, default=32, help="eval: held-out sentences to score"
    )
    parser.add_argument(
        "--held-out-of",
        default="",
        help="eval: score this corpus kind's held-out sentences (templates | broad) instead "
        "of the voice's own, to compare voices trained on different kinds",
    )


@subcommand("voice", "train or evaluate the default voice", _voice_cmd_flags)
def voice(args: argparse.Namespace) -> int:
    from tts.train.recipe import VoiceTrainConfig, run

    cfg = config_from(VoiceTrainConfig, args)
    if args.action == "train":
        return run(cfg)
    from tts.train.evaluate import evaluate

    evaluate(args.voice, cfg, args.report, args.eval_sentences, held_out_of=args.held_out_of)
    return 0
