"""Realistic test data, seeded: prompts in many languages and scripts, file names and paths.

Made with Faker (the ``test`` extra) where the shape of real data matters: words without
spaces between them (Chinese, Japanese), non-Latin scripts, accents, names with spaces and
apostrophes. Faker is imported inside the generators, never at module import: only a test
that asks for this data pays Faker's import (its locales), not pytest's start-up nor any
`ascendgraph` command (pyproject.toml's ``-p no:faker`` keeps Faker's own pytest plugin off).
Every generator takes a seed: the same seed gives the same data on every machine.
"""

from __future__ import annotations

from typing import Any

# One locale per script family a prompt may come in.
PROMPT_LOCALES = (
    "en_US", "de_DE", "fr_FR", "es_ES", "pl_PL", "tr_TR", "ru_RU", "el_GR", "ar_AA", "he_IL",
    "hi_IN", "th_TH", "ja_JP", "zh_CN", "ko_KR",
)
# Locales whose file names and person names carry non-ASCII letters, spaces or apostrophes.
NAME_LOCALES = ("en_US", "fr_FR", "de_DE", "ja_JP", "zh_CN", "ru_RU", "el_GR")


def _faker(locale: str, seed: int) -> Any:
    from faker import Faker  # here, not at module level (see the module docstring)

    fake = Faker(locale)
    fake.seed_instance(seed)
    return fake


def prompts(count_per_locale: int = 2, *, seed: int = 0) -> list[tuple[str, str]]:
    """(locale, text) pairs: ``count_per_locale`` paragraphs of a few sentences in each locale."""
    pairs = []
    for index, locale in enumerate(PROMPT_LOCALES):
        fake = _faker(locale, seed * 1000 + index)
        pairs += [(locale, fake.paragraph(nb_sentences=3)) for _ in range(count_per_locale)]
    return pairs


def file_names(count_per_locale: int = 3, *, seed: int = 0) -> list[str]:
    """File names a user might give: a person's or company's name in a locale's script, with
    spaces and punctuation, and an extension (``.log``)."""
    names = []
    for index, locale in enumerate(NAME_LOCALES):
        fake = _faker(locale, seed * 1000 + index)
        for _ in range(count_per_locale):
            stem = fake.name() if fake.boolean() else fake.company()
            names.append(stem.replace("/", " ") + ".log")
    return names


def nested_paths(count: int = 5, *, seed: int = 0) -> list[str]:
    """Relative paths two to four folders deep, with words of several locales."""
    paths = []
    for index in range(count):
        fake = _faker(NAME_LOCALES[index % len(NAME_LOCALES)], seed * 1000 + index)
        parts = [fake.word().replace("/", "-") for _ in range(fake.random_int(2, 4))]
        paths.append("/".join(parts))
    return paths
