"""Which vLLM a vLLM Ascend source tree targets, said in one line.

``python tests/vllm_ascend/source_info.py SRC ENV_VLLM`` prints
``vLLM Ascend at SRC targets vLLM X (from WHERE); this environment has vLLM Y`` and, when
X and Y differ, a second line starting ``warning:``. Exit status 0 either way (a checkout
for another vLLM still runs; its failures may be version skew).

Where the target is read, first match wins: ``.github/vllm-release-tag.commit`` and the
``Dockerfile``'s ``VLLM_TAG`` (a full checkout), the README's support table line
"CI commitment for vLLM main branch and vLLM vX tag" (the snapshot has no Dockerfile), else
the most frequent ``vllm_version_is("X")`` literal in ``vllm_ascend/``.
"""

from __future__ import annotations

import collections
import re
import sys
from pathlib import Path
from typing import Optional

__all__ = ["target_vllm", "version_line"]

_TAG = re.compile(r"v?(\d+\.\d+\.\d+(?:[.\w+-]*)?)")


def _from_tag_file(src: Path) -> Optional[tuple[str, str]]:
    path = src / ".github" / "vllm-release-tag.commit"
    if path.is_file():
        match = _TAG.search(path.read_text())
        if match:
            return match.group(1), ".github/vllm-release-tag.commit"
    return None


def _from_dockerfile(src: Path) -> Optional[tuple[str, str]]:
    path = src / "Dockerfile"
    if path.is_file():
        match = re.search(r"VLLM_TAG=v?(\d+\.\d+\.\d+\S*)", path.read_text())
        if match:
            return match.group(1), "Dockerfile VLLM_TAG"
    return None


def _from_readme(src: Path) -> Optional[tuple[str, str]]:
    path = src / "README.md"
    if path.is_file():
        match = re.search(r"CI commitment for vLLM main branch and vLLM v(\d+\.\d+\.\d+\S*) tag", path.read_text())
        if match:
            return match.group(1), "README.md support table"
    return None


def _from_code(src: Path) -> Optional[tuple[str, str]]:
    counts: collections.Counter[str] = collections.Counter()
    for path in (src / "vllm_ascend").rglob("*.py"):
        counts.update(re.findall(r'vllm_version_is\(\s*"([^"]+)"\s*\)', path.read_text(errors="replace")))
    if counts:
        version, _ = counts.most_common(1)[0]
        return version, 'the most frequent vllm_version_is("...") in vllm_ascend/'
    return None


def target_vllm(src: Path) -> Optional[tuple[str, str]]:
    """(version, where it was read) for the source tree at ``src``, or None."""
    for reader in (_from_tag_file, _from_dockerfile, _from_readme, _from_code):
        found = reader(src)
        if found is not None:
            return found
    return None


def version_line(src: Path, env_vllm: str) -> list[str]:
    found = target_vllm(src)
    if found is None:
        return [f"vLLM Ascend at {src}: target vLLM unknown (no tag file, Dockerfile, README line or "
                f"vllm_version_is call); this environment has vLLM {env_vllm}",
                "warning: cannot tell whether the source targets this environment's vLLM"]
    version, where = found
    lines = [f"vLLM Ascend at {src} targets vLLM {version} (from {where}); this environment has vLLM {env_vllm}"]
    if version.lstrip("v") != env_vllm.lstrip("v"):
        lines.append(f"warning: vLLM Ascend targets vLLM {version} but this environment has vLLM {env_vllm}; "
                     "failures may be version skew")
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: source_info.py VLLM_ASCEND_SRC ENV_VLLM_VERSION", file=sys.stderr)
        sys.exit(2)
    for line in version_line(Path(sys.argv[1]), sys.argv[2]):
        print(line)
