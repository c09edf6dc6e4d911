"""The Wyoming `info` this server answers `describe` with: one speech-to-text program (our VAD +
Whisper, biased toward the home's vocabulary), one text-to-speech program (espeak-ng), one intent
handling program (the engine's model, with the home's actions when it has any).

Home Assistant's Wyoming integration makes an entity of each: a speech-to-text, a text-to-speech
and a conversation agent (docs/voice.md).
"""

from __future__ import annotations

from wyoming.info import (AsrModel, AsrProgram, Attribution, HandleModel, HandleProgram, Info,
                          TtsProgram, TtsVoice)

from edge_runtime import __version__

ATTRIBUTION = Attribution(name="edge-runtime", url="")  # a local appliance: nowhere to link
LANGUAGES = ["en"]  # Whisper tiny.en, the English espeak-ng voices, the English system prompts
ESPEAK = Attribution(name="espeak-ng", url="https://github.com/espeak-ng/espeak-ng")
# espeak-ng voices offered by name (any other installed one can be asked for in `synthesize`)
VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb-scotland", "en-us+m3")


def server_info(asr_name: str, model_name: str, tts_voice: str, has_actions: bool) -> Info:
    """`asr_name`: the recognizer's name (whisper:tiny.en); `model_name`: the engine's model."""
    asr = AsrProgram(
        name="edge-runtime-asr", attribution=ATTRIBUTION, installed=True, version=__version__,
        description="silero VAD + faster-whisper, biased toward the home's device names",
        models=[AsrModel(name=asr_name, attribution=ATTRIBUTION, installed=True,
                         description=asr_name, version=None, languages=LANGUAGES)],
        requires_external_vad=False,  # our VAD cuts a satellite's stream into commands
    )
    voices = [TtsVoice(name=v, attribution=ESPEAK,
                       installed=True, description=f"espeak-ng {v}", version=None,
                       languages=LANGUAGES)
              for v in dict.fromkeys((tts_voice,) + VOICES)]
    tts = TtsProgram(name="edge-runtime-tts", attribution=ATTRIBUTION, installed=True,
                     version=__version__, description="espeak-ng, streamed as it speaks",
                     voices=voices)
    handle = HandleProgram(
        name="edge-runtime-handle", attribution=ATTRIBUTION, installed=True, version=__version__,
        description="the home's commands answered by the local model"
                    + (" and dispatched to its actions" if has_actions else ""),
        models=[HandleModel(name=model_name, attribution=ATTRIBUTION, installed=True,
                            description=model_name, version=None, languages=LANGUAGES)],
        supports_home_control=has_actions,
    )
    return Info(asr=[asr], tts=[tts], handle=[handle])
