"""Chorus's own speaker encoder, and what uses it outside training.

* :mod:`~chorus.speaker_recognition.encoder` - the network (ResNet / DF-ResNet trunk, reversible or not) and its
  AAM training head.
* :mod:`~chorus.speaker_recognition.bundle` - a trained encoder: embed clips, score and verify pairs against its
  calibrated threshold; save, load, the shipped one.
* :mod:`~chorus.speaker_recognition.verification` - EER and minDCF of trials (the threshold's calibration), trials files.
* :mod:`~chorus.speaker_recognition.start` - where a new voice starts: the nearest base speaker and a speaker vector
  mapped from its clips' embedding.

Its training loop is :mod:`chorus.training.speaker_encoder`; the memory of a training step,
:mod:`chorus.memory.speaker_encoder`.
"""
