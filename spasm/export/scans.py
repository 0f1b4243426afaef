"""QA scans of single utterances, and redaction (docs/export.md).

Each scan is a small pure function ``(text, context) -> list[Finding]`` registered by the kind
of finding it reports, like the projections in :mod:`spasm.projection`::

    @register_scan("my_kind")
    def my_scan(text: str, ctx: ScanContext) -> list[Finding]: ...

Contact-like strings (``email``, ``url``, ``phone``, ``number``) are *redactable*: their finding
names the typed placeholder an export puts in their place. Where two redactable matches overlap
(a phone number is also a digit run), the longer one wins, then the one earlier in
:data:`REDACTABLE`. :func:`redact` is pure and returns what it replaced by what, so every
redaction is visible in the data (like the harness's clips).

The other kinds (``ai_identity``, ``prompt_leak``, ``harness_notes``, ``empty_turn``,
``off_language``) cannot be redacted: an export drops a dialogue that has one unless told to
keep it (``--allow-qa KIND``).
``off_language`` is an utterance in another language than the persona's, by the identifier and
thresholds of :mod:`spasm.language` (those of ``spasm eval``'s language compliance); without
py3langid installed it is not scanned. Dialogue-level kinds (alternation,
duplicates, role flips) live in :mod:`spasm.export.qa` and :mod:`spasm.export.dedup`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from spasm.errors import UserError
from spasm.language import DEFAULT_LANGUAGE, detect, identifier_available, is_off_language
from spasm.registry import SCANS

__all__ = [
    "PLACEHOLDERS",
    "REDACTABLE",
    "Finding",
    "PromptRef",
    "Replacement",
    "ScanContext",
    "prompt_ref",
    "redact",
    "register_scan",
    "scan_names",
    "scan_text",
    "words_of",
]

#: Redactable kinds, in order of precedence on a tie, and their placeholders.
PLACEHOLDERS: dict[str, str] = {"email": "[EMAIL]", "url": "[URL]", "phone": "[PHONE]",
                                "number": "[NUMBER]"}
REDACTABLE: tuple[str, ...] = tuple(PLACEHOLDERS)

#: Words in a row that count as a fragment of a system prompt (long enough that ordinary
#: speech does not repeat 8 words of an instruction by chance).
LEAK_WORDS = 8


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a scan found in an utterance (offsets into the original text)."""

    kind: str
    start: int
    end: int
    evidence: str
    #: The placeholder an export puts in its place; ``None``: it cannot be redacted.
    redaction: str | None = None


@dataclass(frozen=True, slots=True)
class Replacement:
    """What :func:`redact` replaced, by what (offsets into the original text)."""

    kind: str
    start: int
    end: int
    original: str
    placeholder: str


@dataclass(frozen=True, slots=True)
class PromptRef:
    """What counts as a prompt fragment in one dialogue: every run of ``LEAK_WORDS`` words of
    its system prompts and framing texts (see :func:`prompt_ref`)."""

    #: The words of the prompts (a run of ``LEAK_WORDS`` of them is needed for any hit).
    words: frozenset[str] = frozenset()
    #: ``hash`` of each ``LEAK_WORDS``-word tuple.
    grams: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class ScanContext:
    """What a scan may know besides the text: who spoke, the dialogue's prompts, and the
    language its persona speaks (an ISO 639-1 code, English by default)."""

    speaker: str = "client"
    prompts: PromptRef = field(default_factory=PromptRef)
    language: str = DEFAULT_LANGUAGE


def _leak_grams(words: list[str]) -> set[int]:
    return {hash(tuple(words[i : i + LEAK_WORDS])) for i in range(len(words) - LEAK_WORDS + 1)}


def prompt_ref(prompts: Iterable[str], own: Iterable[str] = ()) -> PromptRef:
    """The fragments of ``prompts`` an utterance must not repeat, except those also found in
    ``own`` (texts the speaker may say in its own words, e.g. the persona's concern)."""
    grams: set[int] = set()
    vocab: set[str] = set()
    for text in prompts:
        words = words_of(text)
        grams |= _leak_grams(words)
        vocab.update(words)
    for text in own:
        grams -= _leak_grams(words_of(text))
    return PromptRef(frozenset(vocab), frozenset(grams))


Scan = Callable[[str, ScanContext], list[Finding]]


def register_scan(kind: str, *, replace: bool = False) -> Callable[[Scan], Scan]:
    """Register a scan reporting findings of ``kind`` (decorator) in :data:`spasm.registry.SCANS`;
    a plugin replaces a built-in kind only with ``replace=True``."""
    return SCANS.register(kind, replace=replace)


def scan_names() -> list[str]:
    """Kinds of the registered utterance scans (the installed plugins' too)."""
    return SCANS.names()


def scan_text(text: str, ctx: ScanContext, kinds: Iterable[str] | None = None) -> list[Finding]:
    """Every registered scan (or those of ``kinds``) over ``text``; redactable findings are
    made non-overlapping; sorted by position."""
    if kinds is None:
        scans = SCANS.registered()
    else:
        looked_up = [(k, SCANS.get(k)) for k in kinds]
        unknown = [k for k, scan in looked_up if scan is None]
        if unknown:
            raise UserError(f"unknown QA scan(s) {', '.join(unknown)}; known: {', '.join(scan_names())}")
        scans = [(k, scan) for k, scan in looked_up if scan is not None]
    found: list[Finding] = []
    folded, where = _fold(text) if any(n in PLACEHOLDERS for n, _ in scans) else (text, None)
    for name, scan in scans:
        if name not in PLACEHOLDERS:
            found += scan(text, ctx)
        elif where is None:
            found += scan(folded, ctx)
        else:  # found in the folded text: offsets and evidence of the original
            for f in scan(folded, ctx):
                start, end = where[f.start], where[f.end - 1] + 1
                found.append(Finding(f.kind, start, end, text[start:end], f.redaction))
    return sorted(_resolve(found), key=lambda f: (f.start, f.end, f.kind))


#: "[at]", "(at)", "{dot}", "<dot>" (spaces around allowed): an address spelled out to dodge a scan.
_SPELLED = re.compile(r"\s*[\[({<]\s*(at|dot)\s*[\])}>]\s*", re.IGNORECASE)


def _fold(text: str) -> tuple[str, list[int] | None]:
    """``text`` as the contact scans read it: NFKC-normalised (fullwidth ``ｊｏｈｎ＠…`` is
    ``john@…``) and with spelled-out ``[at]``/``(dot)`` as ``@``/``.``; and the offset in
    ``text`` of each character (``None``: the text is unchanged)."""
    if text.isascii() and not _SPELLED.search(text):
        return text, None
    parts: list[str] = []
    where: list[int] = []
    for i, c in enumerate(text):
        n = c if c.isascii() else unicodedata.normalize("NFKC", c)
        parts.append(n)
        where += [i] * len(n)
    folded = "".join(parts)
    out: list[str] = []
    mapped: list[int] = []
    last = 0
    for m in _SPELLED.finditer(folded):
        out += [folded[last : m.start()], "@" if m.group(1).lower() == "at" else "."]
        mapped += [*where[last : m.start()], where[m.start()]]
        last = m.end()
    out.append(folded[last:])
    mapped += where[last:]
    return "".join(out), mapped


def _resolve(findings: list[Finding]) -> list[Finding]:
    """Keep non-overlapping redactable findings: the longest first, then by precedence."""
    redactable = [f for f in findings if f.redaction is not None]
    if len(redactable) < 2:
        return findings
    ranked = sorted(redactable, key=lambda f: (f.start - f.end, REDACTABLE.index(f.kind), f.start))
    kept: list[Finding] = []
    for f in ranked:
        if all(f.end <= k.start or f.start >= k.end for k in kept):
            kept.append(f)
    return [f for f in findings if f.redaction is None] + kept


def redact(text: str, findings: Iterable[Finding]) -> tuple[str, list[Replacement]]:
    """``text`` with every redactable finding replaced by its placeholder, and the list of
    replacements (overlapping findings after the first are ignored)."""
    spans = sorted((f for f in findings if f.redaction is not None), key=lambda f: (f.start, -f.end))
    out: list[str] = []
    done: list[Replacement] = []
    pos = 0
    for f in spans:
        if f.start < pos:
            continue
        assert f.redaction is not None
        out += [text[pos : f.start], f.redaction]
        done.append(Replacement(f.kind, f.start, f.end, text[f.start : f.end], f.redaction))
        pos = f.end
    out.append(text[pos:])
    return "".join(out), done


# ----------------------------------------------------------------------- contact-like strings

_EMAIL = re.compile(
    r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b"
)
_TLDS = ("com|org|net|io|co|uk|de|fr|es|it|nl|eu|ch|at|be|se|no|dk|fi|pl|pt|ie|us|ca|au|nz|in|jp|cn"
         "|br|mx|ru|gov|edu|info|biz|me|app|dev|ly|tv|xyz|online|shop")
_URL = re.compile(
    r"\b(?:https?://|www\.)[^\s<>\"'`]+"
    rf"|(?<![@\w.-])(?:[a-z0-9](?:[a-z0-9-]{{0,61}}[a-z0-9])?\.)+(?:{_TLDS})\b(?:/[^\s<>\"'`]*)?",
    re.IGNORECASE,
)
_PHONE = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{1,5}\)[\s.-]?)?\d{2,5}(?:[\s.-]\d{2,6}){1,4}(?!\w|[.-]\d)"
    r"|(?<![\w+])\+\d{8,15}(?!\w)"
)
_NUMBER = re.compile(
    r"(?<![\w.,])\d(?:[ -]?\d){8,29}(?!\w|[.,-]\d)"  # card/account-like digit runs (9+ digits)
    r"|\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,3})?\b"  # IBAN-like
)
_URL_HINT = re.compile(rf"://|www\.|\.(?:{_TLDS})\b", re.IGNORECASE)  # cheap pre-check
_IBAN_HINT = re.compile(r"\b[A-Z]{2}\d{2}")
_TRAILING = ".,;:!?)]}'\""
# Thousands written with separators ("1 200 000 000") are amounts, not numbers to hide.
_THOUSANDS = re.compile(r"\d{1,3}(?:[ ,.]\d{3})+")


# Cheap pre-check for phone and number scans: 7 digits with at most separators between them.
_SEVEN_DIGITS = re.compile(r"\d(?:[ ().+-]{0,3}\d){6}")


def _digits(s: str) -> int:
    return sum(c.isdigit() for c in s)


@register_scan("email")
def scan_email(text: str, ctx: ScanContext) -> list[Finding]:
    """E-mail addresses."""
    if "@" not in text:
        return []
    return [Finding("email", m.start(), m.end(), m.group(), "[EMAIL]") for m in _EMAIL.finditer(text)]


@register_scan("url")
def scan_url(text: str, ctx: ScanContext) -> list[Finding]:
    """Web addresses: with a scheme, ``www.``, or a bare domain with a common top-level domain."""
    if "." not in text or not _URL_HINT.search(text):
        return []
    found = []
    for m in _URL.finditer(text):
        end = m.end()
        while end > m.start() and text[end - 1] in _TRAILING:
            end -= 1  # "see example.com." ends the sentence, not the address
        if end > m.start():
            found.append(Finding("url", m.start(), end, text[m.start() : end], "[URL]"))
    return found


@register_scan("phone")
def scan_phone(text: str, ctx: ScanContext) -> list[Finding]:
    """Phone-like numbers: 9-15 digits in groups (7+ with a ``+`` or an area code in
    parentheses). Dates and year ranges have at most 8 digits, so they never match."""
    if not _SEVEN_DIGITS.search(text):
        return []
    found = []
    for m in _PHONE.finditer(text):
        s = m.group()
        n = _digits(s)
        marked = s.startswith("+") or "(" in s
        if n > 15 or n < (7 if marked else 9) or _THOUSANDS.fullmatch(s):
            continue
        found.append(Finding("phone", m.start(), m.end(), s, "[PHONE]"))
    return found


@register_scan("number")
def scan_number(text: str, ctx: ScanContext) -> list[Finding]:
    """Card- or account-like digit runs (9+ digits, spaces or dashes allowed) and IBANs."""
    if not _SEVEN_DIGITS.search(text) and not _IBAN_HINT.search(text):
        return []
    found = []
    for m in _NUMBER.finditer(text):
        s = m.group()
        if _THOUSANDS.fullmatch(s) or _digits(s) < 9:
            continue
        found.append(Finding("number", m.start(), m.end(), s, "[NUMBER]"))
    return found


# ----------------------------------------------------------------------- what cannot be redacted

_AI_IDENTITY = re.compile(
    r"\bas an? (?:ai|a\.i\.|artificial intelligence|chatbot)(?: (?:language )?model| assistant)?\b"
    r"|\bas an? (?:large )?language model\b"
    r"|\b(?:large )?language models?\b"
    r"|\bI(?:'m| am) (?:just |only |merely |simply )?(?:an? )?(?:ai|a\.i\.|artificial intelligence"
    r"|chatbot|virtual assistant|computer program)\b(?! (?:researcher|engineer|start-?up|company|"
    r"ethics|course|class|tool|product)s?\b)"
    r"|\bAI (?:language model|assistant|chatbot)\b"
    r"|\bmy (?:training data|knowledge cut-?off)\b"
    r"|\b(?:trained|developed|created|built|made) by (?:openai|anthropic|google deepmind|deepseek|"
    r"mistral ai|meta ai|hugging ?face)\b"
    r"|\bI (?:do not|don't) have (?:personal (?:feelings|opinions|experiences|emotions)|a (?:physical )?"
    r"body|a physical form)\b",
    re.IGNORECASE,
)


@register_scan("ai_identity")
def scan_ai_identity(text: str, ctx: ScanContext) -> list[Finding]:
    """An agent stepping out of its role to say it is an AI or a language model."""
    return [Finding("ai_identity", m.start(), m.end(), m.group()) for m in _AI_IDENTITY.finditer(text)]


#: The fixed lines of the Persona Harness's private notes (the turn block of
#: :func:`spasm.harness.prompt.turn_block` and the scene lines of
#: :class:`spasm.harness.runtime.HarnessedAgent`): a reply that repeats one copied its notes
#: instead of speaking (small models do). ``tests/test_qa.py`` renders a real block against it.
_HARNESS_NOTES = re.compile(
    r"private notes for your next message|where you stand now:"
    r"|this is message \d+ of the conversation|\btopic so far:"
    r"|the conversation has shifted from [a-z ]+ to [a-z ]+:|\bstill open:|\blast correction:",
    re.IGNORECASE,
)


@register_scan("harness_notes")
def scan_harness_notes(text: str, ctx: ScanContext) -> list[Finding]:
    """A line of the harness's private notes repeated in an utterance."""
    return [Finding("harness_notes", m.start(), m.end(), m.group())
            for m in _HARNESS_NOTES.finditer(text)]


@register_scan("empty_turn")
def scan_empty(text: str, ctx: ScanContext) -> list[Finding]:
    """An utterance with no visible text."""
    if text.strip():
        return []
    return [Finding("empty_turn", 0, len(text), repr(text))]


@register_scan("off_language")
def scan_off_language(text: str, ctx: ScanContext) -> list[Finding]:
    """An utterance confidently in another language than the persona's (20+ letters,
    probability 0.9+; nothing without py3langid). The evidence names both languages and quotes
    the utterance."""
    if not identifier_available():
        return []
    lang, prob = detect(text)
    if not is_off_language(lang, prob, ctx.language):
        return []
    quoted = text if len(text) <= 160 else text[:157] + "..."
    return [Finding("off_language", 0, len(text),
                    f"{lang} (p={prob:.2f}), expected {ctx.language}: {quoted}")]


_WORD = re.compile(r"\w+")
def words_of(text: str) -> list[str]:
    """The lower-cased words of ``text``."""
    return _WORD.findall(text.lower())


@register_scan("prompt_leak")
def scan_prompt_leak(text: str, ctx: ScanContext) -> list[Finding]:
    """``LEAK_WORDS`` or more words in a row taken from a system prompt or framing text of the
    dialogue (case and punctuation ignored)."""
    ref = ctx.prompts
    if not ref.grams:
        return []
    words = words_of(text)
    run = longest = 0
    for w in words:  # cheap pre-check: a hit needs LEAK_WORDS prompt words in a row
        run = run + 1 if w in ref.words else 0
        longest = max(longest, run)
    if longest < LEAK_WORDS:
        return []
    matches = list(_WORD.finditer(text))
    lowered = [m.group().lower() for m in matches]
    spans: list[list[int]] = []  # [first word, last word] of each run of overlapping hits
    for i in range(len(lowered) - LEAK_WORDS + 1):
        if hash(tuple(lowered[i : i + LEAK_WORDS])) not in ref.grams:
            continue
        if spans and i <= spans[-1][1]:
            spans[-1][1] = i + LEAK_WORDS - 1
        else:
            spans.append([i, i + LEAK_WORDS - 1])
    out = []
    for a, b in spans:
        start, end = matches[a].start(), matches[b].end()
        out.append(Finding("prompt_leak", start, end, text[start:end]))
    return out
