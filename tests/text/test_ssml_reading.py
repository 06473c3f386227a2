"""SSML as a new user writes it: elements Chorus does not follow read as their text, and SSML without a
``<speak>`` root read as SSML, not aloud as markup."""

from __future__ import annotations

import re

import pytest

from chorus.synthesis.timeline import layout
from chorus.text.ssml import IgnoredSsmlWarning, Pause, SsmlError, is_ssml, parse_ssml


def test_elements_chorus_does_not_follow_are_read_as_their_text_and_named() -> None:
    """A new user's probe: one <emphasis> had thrown the whole text away (the CLI skipped it, the server
    answered 400); SSML asks a processor to speak the text of elements it does not support."""
    skipped: list[str] = []
    pieces = layout(
        '<speak xmlns="http://www.w3.org/2001/10/synthesis"><emphasis>Really</emphasis> now. '
        '<prosody rate="slow"><voice name="x">Slowly <lang xml:lang="fr-FR">au revoir</lang></voice></prosody>'
        '<mark name="here"/>. <audio src="dog.wav">A dog barks<desc>barking</desc>.</audio> '
        '<say-as interpret-as="time">5:30</say-as> and <unknown>more</unknown>.<break time="1s"/>'
        "<emphasis>Again</emphasis>.</speak>",
        sentence_silence=0,
        skipped=skipped,
    )
    assert pieces == ["Really now.", "Slowly au revoir.", "A dog barks.", "5:30 and more.", Pause(1.0), "Again."]
    # Each once, in the order met; an audio clip's <desc> describes it and is not read.
    assert skipped == [
        "<emphasis>",
        "<prosody>",
        "<voice>",
        "<lang>",
        "<mark>",
        "<audio>",
        "<desc>",
        '<say-as interpret-as="time">',
        "<unknown>",
    ]
    # Without a list to name them in (the CLI's), a warning names them, as for text left out.
    with pytest.warns(IgnoredSsmlWarning, match=re.escape("<emphasis>")):
        assert layout("<speak><emphasis>Really</emphasis> now.</speak>") == ["Really now."]
    named: list[str] = []
    assert parse_ssml("<speak><s><emphasis>Really</emphasis></s> now.</speak>", named) == ["Really\nnow."]
    assert named == ["<emphasis>"]


def test_ssml_that_cannot_be_read_sensibly_is_still_refused() -> None:
    for bad, message in [
        ('<speak><break time="abc"/>Hi</speak>', "give milliseconds or seconds"),
        ('<speak><emphasis><break strength="loud"/>Hi</emphasis></speak>', "strength='loud'"),
        ("<speak>" + "<s>" * 500 + "x" + "</s>" * 500 + "</speak>", "nested more than 50"),  # a review: a 500
        ('<speak>The <say-as interpret-as="ordinal">\u00b2</say-as> one.</speak>', "is not a whole number"),  # a 500
        ('The <say-as interpret-as="ordinal">\u1369</say-as> one.', "is not a whole number"),
        ("<w>" * 60 + "x" + "</w>" * 60, "nested more than 50"),
        ("<speak><phoneme>Chorus</phoneme></speak>", "<phoneme> needs a ph"),
        ('<speak><phoneme alphabet="x-sampa" ph="a">a</phoneme></speak>', "only 'ipa'"),
        ("<speak><emphasis>Hi</speak>", "does not parse"),
        ('Wait <break time="1s"/> <b>now.', "does not parse"),  # SSML without a root is still markup
    ]:
        with pytest.raises(SsmlError, match=re.escape(message)):
            layout(bad, skipped=[])


def test_ssml_without_a_speak_root_is_read_as_ssml() -> None:
    """A new user's probe: 'Wait <break time="1s"/> now.' had been read aloud as "break time one s"."""
    assert layout('Wait <break time="1s"/> now.', sentence_silence=0) == ["Wait", Pause(1.0), "now."]
    skipped: list[str] = []
    assert layout("I <emphasis>mean</emphasis> it. <s>Yes</s>", sentence_silence=0, skipped=skipped) == [
        "I mean it.",
        "Yes",
    ]
    assert skipped == ["<emphasis>"]
    # A "<" or "&" of the writer's around the markup is text, not broken markup.
    assert layout('Q&A: x < 5 <break time="500ms"/> and y &amp; z.', sentence_silence=0) == [
        "Q&A: x < 5",
        Pause(0.5),
        "and y & z.",
    ]
    for text in ('Wait <break time="1s"/> now.', "<p>One</p>", '<say-as interpret-as="digits">12</say-as>'):
        assert is_ssml(text), text
    # A review: HTML's entities, which XML lacks, and HTML's <sub> (a subscript, no alias) had been a 400.
    assert layout("<p>Fish &amp; chips &mdash; yum</p>", skipped=[]) == ["Fish & chips — yum"]
    assert layout("Wait <break/> Tom&nbsp;Jerry &bogus;", sentence_silence=0) == [
        "Wait",
        Pause(0.4),
        "Tom\xa0Jerry &bogus;",
    ]
    skipped = []
    assert layout("Water is H<sub>2</sub>O.", skipped=skipped) == ["Water is H2O."]
    assert skipped == ["<sub> without an alias"]


def test_text_with_angle_brackets_but_no_ssml_element_stays_plain() -> None:
    for text in ("x < 5 and y > 3.", "a <b> c", "Use <p> to start a paragraph.", "a <br/> b", "<breakfast/>", "1<2"):
        assert not is_ssml(text), text
        assert layout(text, skipped=[]) == [text]
    assert not is_ssml("<speaker> said so")  # a root named like <speak>, but another
    assert is_ssml("<speak>Hi") and is_ssml('<?xml version="1.0"?><speak>Hi</speak>')


def test_telling_ssml_from_text_scans_it_a_fixed_number_of_times(monkeypatch) -> None:
    """Searching for a closing tag after each opening one took 19 s for 100,000 characters of "<s>": the scans
    grew with the tags. Each pattern now reads the text once (the patterns' own runs stop at the next "<"), so
    the count of scans is the same for 10 tags as for 40,000."""
    from chorus.text import ssml

    scans: list[str] = []

    class Counted:
        def __init__(self, name: str, pattern: re.Pattern):
            self.name, self.pattern = name, pattern

        def __getattr__(self, method: str):
            def scan(*args, **kwargs):
                scans.append(self.name)
                return getattr(self.pattern, method)(*args, **kwargs)

            return scan

    for name in ("_SPEAK_ROOT", "_EMPTY_ELEMENT", "_OPENING_TAG", "_CLOSING_TAG"):
        monkeypatch.setattr(ssml, name, Counted(name, getattr(ssml, name)))
    for unit in ("<s>", "<p ", "<break ", "<s></p>"):
        counts = []
        for repeats in (10, 40_000):
            scans.clear()
            assert not is_ssml(unit * repeats)
            counts.append(len(scans))
        assert counts[0] == counts[1] <= 4, (unit, counts)
