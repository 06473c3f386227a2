"""Frame-level pitch targets for the optional pitch predictor, on the mel frame grid."""

from __future__ import annotations

import warnings

import numpy as np

from chorus.audio.mel import MelConfig


def frame_log_f0(audio: np.ndarray, n_frames: int, config: MelConfig = MelConfig()) -> np.ndarray:
    """log F0 of mono ``audio [samples]`` at each of ``n_frames`` mel frames ``[n_frames]`` float32.

    WORLD's DIO + StoneMask at the mel hop; unvoiced frames are filled by linear interpolation between
    voiced neighbours (so the target is continuous), and an utterance with no voiced frame is all zeros.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        try:
            import pyworld
        except ImportError as error:
            raise ImportError("pitch targets need pyworld: pip install 'chorus-tts[judges]'") from error
    x = np.asarray(audio, dtype=np.float64)
    period_ms = 1000.0 * config.hop_length / config.sample_rate
    f0, times = pyworld.dio(x, config.sample_rate, frame_period=period_ms, f0_floor=60.0, f0_ceil=800.0)
    f0 = pyworld.stonemask(x, f0, times, config.sample_rate)
    f0 = np.pad(f0, (0, max(0, n_frames - len(f0))), mode="edge")[:n_frames]
    voiced = f0 > 0
    if not voiced.any():
        return np.zeros(n_frames, dtype=np.float32)
    log_f0 = np.zeros(n_frames)
    log_f0[voiced] = np.log(f0[voiced])
    index = np.arange(n_frames)
    return np.interp(index, index[voiced], log_f0[voiced]).astype(np.float32)
