"""A persona's language, and the offline identifier that tells which language a text is in.

One owner for both, below every layer that needs them: the persona schema checks a
``language`` field's values here, the dialogue's frames name the language they ask for
(:func:`language_name`), ``spasm eval``'s language-compliance metric
(:mod:`spasm.evaluation.language`) and the export's ``off_language`` QA scan
(:mod:`spasm.export.scans`) call :func:`detect` and :func:`is_off_language` with the same
thresholds, so a flag means the same thing everywhere.

The identifier is ``py3langid``, the maintained fork of langid.py (Lui & Baldwin, 2012), whose
naive-Bayes model over byte n-grams ships inside the package (97 languages, numpy only,
~0.1 ms an utterance); it is imported on first use (the ``eval`` extra). A text is classified
when it has at least :data:`MIN_LETTERS` letters, and off-language when the identified
language is not the expected one with a normalised probability of at least
:data:`MIN_CONFIDENCE`.

A persona's language is an ISO 639-1 code (``es``), a tag (``pt-BR``) or an English name
(``Spanish``); a persona without one is English.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from spasm.errors import UserError

__all__ = [
    "DEFAULT_LANGUAGE",
    "MIN_CONFIDENCE",
    "MIN_LETTERS",
    "detect",
    "expected_language",
    "identifier_available",
    "is_off_language",
    "language_code",
    "language_name",
]

DEFAULT_LANGUAGE = "en"
MIN_LETTERS = 20
MIN_CONFIDENCE = 0.9

_NAMES = {
    "english": "en", "spanish": "es", "french": "fr", "german": "de", "portuguese": "pt",
    "italian": "it", "dutch": "nl", "japanese": "ja", "chinese": "zh", "mandarin": "zh",
    "korean": "ko", "russian": "ru", "arabic": "ar", "hindi": "hi", "turkish": "tr",
    "polish": "pl", "swedish": "sv", "danish": "da", "norwegian": "no", "finnish": "fi",
    "greek": "el", "hebrew": "he", "czech": "cs", "hungarian": "hu", "romanian": "ro",
    "ukrainian": "uk", "vietnamese": "vi", "thai": "th", "indonesian": "id", "malay": "ms",
    "bengali": "bn", "urdu": "ur", "persian": "fa", "farsi": "fa", "tamil": "ta",
    "catalan": "ca", "swahili": "sw", "tagalog": "tl", "filipino": "tl",
}
#: The English name of each code above (the first name listed for it).
_DISPLAY = {code: name.title() for name, code in reversed(list(_NAMES.items()))}
_CODE = re.compile(r"[a-z]{2,3}")
_LETTER = re.compile(r"[^\W\d_]")


def language_code(value: object) -> str | None:
    """``value`` as an ISO 639 code (``Spanish`` and ``es-MX`` are ``es``); ``None``: no
    language (missing or blank) or not one this module can read."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip().lower()
    if text in _NAMES:
        return _NAMES[text]
    head = re.split(r"[-_]", text, maxsplit=1)[0]
    return head if _CODE.fullmatch(head) else None


def expected_language(raw: object) -> str:
    """A persona's language (its ``language`` field: ``Persona.language``) as an ISO 639-1 code
    (English when it has none); a value that is neither a known name nor a code is compared as
    written, so nothing passes for it."""
    if not isinstance(raw, str) or not raw.strip():
        return DEFAULT_LANGUAGE
    value = raw.strip().lower()
    return _NAMES.get(value) or re.split(r"[-_]", value, maxsplit=1)[0]


def language_name(value: object) -> str | None:
    """How a prompt names the persona's language (``es`` and ``Spanish`` are ``Spanish``),
    or ``None`` when it is English or absent: an English persona's prompts say nothing about
    language (the golden run and the prompt snapshots pin them: tests/test_golden_run.py)."""
    code = language_code(value)
    if code is None or code == DEFAULT_LANGUAGE:
        return None
    name = _DISPLAY.get(code)
    if name is not None:
        return name
    return value.strip() if isinstance(value, str) else code


@functools.lru_cache(maxsize=1)
def _identifier() -> Any:
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError as exc:
        raise UserError(
            "Language identification needs py3langid (part of the 'eval' extra): "
            "pip install 'spasm[eval]'."
        ) from exc
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


@functools.lru_cache(maxsize=1)
def identifier_available() -> bool:
    """Whether py3langid is installed (the export's scan is skipped, and says so, without it)."""
    try:
        import py3langid.langid  # noqa: F401
    except ImportError:
        return False
    return True


def detect(text: str) -> tuple[str | None, float]:
    """The language of ``text`` and its probability; ``(None, 0.0)`` when it is too short."""
    if len(_LETTER.findall(text)) < MIN_LETTERS:
        return None, 0.0
    lang, prob = _identifier().classify(text)
    return str(lang), float(prob)


def is_off_language(detected: str | None, probability: float, expected: str) -> bool:
    """Whether a detection is a confident one of another language than ``expected``."""
    return detected is not None and detected != expected and probability >= MIN_CONFIDENCE
