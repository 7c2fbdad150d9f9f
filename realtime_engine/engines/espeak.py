"""Text → IPA phonemes with the ``espeak-ng`` program, the way Piper voices expect.

espeak-ng is GPL-3, so it only ever runs as a separate program: one persistent
process reads UTF-8 lines on stdin and prints one IPA line per clause it finds.
A known marker line is sent after each query; its (fixed) IPA output marks the
end of the answer, because one input line can give zero or several lines.

espeak-ng drops punctuation, yet the voice was trained on IPA with the clause
punctuation kept (it drives pauses and intonation), so clauses are split here
and their punctuation is put back after phonemizing.

Pure helpers (``split_clauses``, ``chunk_utf8``, ``clean_ipa``, ``join_clauses``)
hold the text rules; ``EspeakPhonemizer`` is only the pipe to the program.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import threading
import time
import unicodedata
from dataclasses import dataclass

from realtime_engine.engines.base import EngineError

# espeak-ng cuts input lines over 999 bytes mid-word.
MAX_LINE_BYTES = 900

# Clause-ending punctuation the voice has symbols for.
SENTENCE_END = frozenset(".!?")
CLAUSE_END = frozenset(",:;")

# A run of punctuation (optionally followed by closing quotes/brackets) that is
# followed by whitespace or the end of the text ends a clause; "3.14" and
# "1,000" do not match because no whitespace follows the mark.
_CLAUSE_BREAK = re.compile(r"([.!?,:;…]+)[\"'”’»)\]]*(?=\s|$)")
_LANGUAGE_FLAG = re.compile(r"\([a-z]{2,3}(?:-[a-z0-9]+)?\)")
_WHITESPACE = re.compile(r"\s+")
# Abbreviations whose period does not end a clause ("Dr. Smith").
_ABBREVIATIONS = frozenset(
    {"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "e.g", "i.e", "approx", "fig"}
)


class EspeakError(EngineError):
    """The espeak-ng program failed, hung or is not installed."""


class EspeakNotFoundError(EspeakError):
    """The espeak-ng program is not on PATH."""


@dataclass(frozen=True)
class Clause:
    """A piece of text between clause punctuation; ``punctuation`` is one mark or ''."""

    text: str
    punctuation: str = ""

    @property
    def ends_sentence(self) -> bool:
        return self.punctuation in SENTENCE_END


def normalize_text(text: str) -> str:
    """NFC (NFD input is mispronounced), one space between words, no control characters."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in text)
    return _WHITESPACE.sub(" ", text).strip()


def _single_mark(run: str) -> str:
    """Reduce a punctuation run ("?!", "...", "…") to the one mark the voice knows."""
    if "?" in run:
        return "?"
    if "!" in run:
        return "!"
    if "." in run or "…" in run:
        return "."
    return run[0]


def _is_abbreviation(text_before: str) -> bool:
    words = text_before.rsplit(" ", 1)
    return words[-1].lower() in _ABBREVIATIONS


def split_clauses(text: str) -> list[Clause]:
    """Split text into clauses at ``. ! ? , : ;`` followed by a space (or the end)."""
    text = normalize_text(text)
    clauses: list[Clause] = []
    start = 0
    for match in _CLAUSE_BREAK.finditer(text):
        mark = _single_mark(match.group(1))
        body = text[start : match.start()].strip()
        if mark == "." and match.group(1) == "." and _is_abbreviation(body):
            continue
        if body:
            clauses.append(Clause(body, mark))
        elif clauses and not clauses[-1].punctuation:
            clauses[-1] = Clause(clauses[-1].text, mark)
        start = match.end()
    tail = text[start:].strip()
    if tail:
        clauses.append(Clause(tail, ""))
    return clauses


def chunk_utf8(text: str, max_bytes: int = MAX_LINE_BYTES) -> list[str]:
    """Split at spaces into pieces of at most ``max_bytes`` UTF-8 bytes.

    A single word longer than the limit is cut between characters (never
    inside a character's encoding).
    """
    if max_bytes < 4:
        raise ValueError("max_bytes must leave room for one UTF-8 character")
    chunks: list[str] = []
    current = ""
    for word in text.split():
        while len(word.encode()) > max_bytes:
            if current:
                chunks.append(current)
                current = ""
            cut = len(word)
            while len(word[:cut].encode()) > max_bytes:
                cut -= 1
            chunks.append(word[:cut])
            word = word[cut:]
        candidate = f"{current} {word}" if current else word
        if len(candidate.encode()) <= max_bytes:
            current = candidate
        else:
            chunks.append(current)
            current = word
    if current:
        chunks.append(current)
    return chunks


def clean_ipa(line: str) -> str:
    """Drop espeak's ``(fr)``/``(en)`` language-switch flags and outer spaces."""
    return _WHITESPACE.sub(" ", _LANGUAGE_FLAG.sub("", line)).strip()


def join_clauses(phonemized: list[tuple[str, str]]) -> str:
    """Join ``(ipa, punctuation)`` pairs the way the voice was trained.

    Each clause keeps its mark and is followed by a space; a clause with no
    phonemes (an emoji espeak drops, say) is left out with its mark.
    """
    return " ".join(ipa + mark for ipa, mark in phonemized if ipa)


class EspeakPhonemizer:
    """A persistent ``espeak-ng --ipa`` process; thread-safe, blocking calls."""

    _MARKER_WORD = "qqzmarkerqq"

    def __init__(
        self, voice: str = "en-us", executable: str = "espeak-ng", timeout_s: float = 10.0
    ) -> None:
        self._voice = voice
        self._executable = executable
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._marker_ipa = ""

    def start(self) -> None:
        with self._lock:
            self._ensure_process()

    def close(self) -> None:
        with self._lock:
            self._stop_process()

    def phonemize(self, text: str) -> str:
        """IPA for ``text`` with clause punctuation re-attached."""
        clauses = split_clauses(text)
        return join_clauses([(self.phonemize_clause(c.text), c.punctuation) for c in clauses])

    def phonemize_clause(self, text: str) -> str:
        """IPA for one clause (no punctuation handling), chunked under the line limit."""
        text = normalize_text(text)
        text = re.sub(self._MARKER_WORD, " ", text, flags=re.IGNORECASE)
        pieces: list[str] = []
        with self._lock:
            for chunk in chunk_utf8(text):
                pieces.extend(self._query(chunk))
        return " ".join(p for p in pieces if p)

    # -- process plumbing -------------------------------------------------

    def _ensure_process(self) -> subprocess.Popen[bytes]:
        if self._process is not None and self._process.poll() is None:
            return self._process
        self._stop_process()
        path = shutil.which(self._executable)
        if path is None:
            raise EspeakNotFoundError(
                f"the {self._executable!r} program was not found on PATH; the CPU voice needs it "
                "for phonemes (Debian/Ubuntu: apt-get install espeak-ng)"
            )
        try:
            self._process = subprocess.Popen(
                [path, "-q", "-b", "1", "--ipa", "-v", self._voice],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError as e:
            raise EspeakError(f"cannot start {path}: {e}") from e
        self._buffer = b""
        self._marker_ipa = ""
        self._marker_ipa = self._exchange(self._MARKER_WORD)[0]
        return self._process

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()

    def _query(self, line: str) -> list[str]:
        self._ensure_process()
        try:
            return self._exchange(line)
        except EspeakError:
            # Leave no half-read answer behind: the next call starts a fresh process.
            self._stop_process()
            raise

    def _exchange(self, line: str) -> list[str]:
        """Send ``line`` then the marker; return the cleaned, non-empty IPA lines."""
        process = self._process
        assert process is not None and process.stdin is not None
        payload = f"{line}\n{self._MARKER_WORD}\n" if self._marker_ipa else f"{line}\n"
        try:
            process.stdin.write(payload.encode())
            process.stdin.flush()
        except OSError as e:
            raise EspeakError(f"espeak-ng stopped accepting input: {e}") from e
        lines: list[str] = []
        deadline = time.monotonic() + self._timeout_s
        while True:
            raw = self._read_line(deadline)
            if not self._marker_ipa:  # learning the marker: its one line is the answer
                return [raw]
            if raw == self._marker_ipa:
                return lines
            cleaned = clean_ipa(raw)
            if cleaned:
                lines.append(cleaned)

    def _read_line(self, deadline: float) -> str:
        process = self._process
        assert process is not None and process.stdout is not None
        fd = process.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EspeakError(f"espeak-ng gave no answer within {self._timeout_s:.1f} s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                raise EspeakError(f"espeak-ng exited (status {process.poll()})")
            self._buffer += data
        raw, self._buffer = self._buffer.split(b"\n", 1)
        return raw.decode("utf-8", errors="replace").strip()
