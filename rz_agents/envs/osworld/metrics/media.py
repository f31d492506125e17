"""Media and e-book metrics: MP3 tags, EPUB books, audio and video similarity.

``check_mp3_meta`` and ``compare_epub`` follow OSWorld's ``metrics/others.py``; ``compare_audios``
and ``compare_videos`` its ``metrics/vlc.py``, with the libraries it computes with: librosa
(decoding, MFCCs) and fastdtw for audio, OpenCV (decoding) and imagehash (pHash) for video. They
come with the ``osworld`` extra; without them ``BLOCKERS`` says which is missing and ``rz osworld
validate`` reports it.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from typing import Any

from rz_agents.envs.osworld.metrics.libraries import missing, require
from rz_agents.envs.osworld.metrics.rules import match_value_to_rule


def check_mp3_meta(result: str | None, meta: dict[str, dict[str, Any]], **_: Any) -> float:
    """1 when every listed ID3 field (EasyID3 names: ``title``, ``artist`` ...) matches its rule.

    A field's values are joined with ``,``; a missing field is ``""``. A file without an ID3 tag
    raises (scored 0), as in OSWorld.
    """
    if result is None:
        return 0.0
    from mutagen.easyid3 import EasyID3

    tags = EasyID3(result)
    ok = True
    for key, rule in meta.items():
        value = tags.get(key, "")
        if isinstance(value, list):
            value = ",".join(value)
        ok = ok and match_value_to_rule(value, rule)
    return float(ok)


def _epub_texts(path: str) -> list[tuple[str, list[str]]]:
    """OSWorld's ``process_epub``: (member, lines) of the parts it compares, sorted by member name.

    ``toc.ncx`` without ``navPoint`` lines, ``content.opf`` without ``dc:identifier`` lines (both
    at the archive's root, else KeyError as there), each ``.html`` member re-serialised by lxml
    (line breaks removed, then pretty-printed). Not a zip: no parts.
    """
    import lxml.html

    try:
        z = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        return []
    with z:
        parts = [
            ("toc.ncx", [ln for ln in z.read("toc.ncx").decode().splitlines() if "navPoint" not in ln]),
            (
                "content.opf",
                [ln for ln in z.read("content.opf").decode().splitlines() if "dc:identifier" not in ln],
            ),
        ]
        for name in z.namelist():
            if name.endswith(".html"):
                text = "".join(ch for ch in z.read(name).decode() if ch not in "\n\r")
                html = lxml.html.fromstring(text.encode())
                parts.append(
                    (name, lxml.html.tostring(html, pretty_print=True, encoding="unicode").splitlines())
                )
    return sorted(parts)


def compare_epub(result: str | None, expected: str, **_: Any) -> float:
    """Product over the paired parts of their line-level difflib ratio (pairs by sorted name, ``zip``)."""
    import difflib

    if result is None:
        return 0.0
    score = 1.0
    for (_, a), (_, b) in zip(_epub_texts(result), _epub_texts(expected), strict=False):
        score *= difflib.SequenceMatcher(a=a, b=b).ratio()
    return score


# --- audio ---------------------------------------------------------------------------------


_AUDIO = missing(("librosa", "librosa"), ("fastdtw", "fastdtw"))
_VIDEO = missing(("cv2", "opencv-python-headless"), ("imagehash", "imagehash"))


def compare_audios(audio_path_1: str | None, audio_path_2: str | None, **_: Any) -> float:
    """``1 / (1 + DTW distance)`` between the two files' row-normalised MFCC sequences, as OSWorld
    (commit 8942695) computes it, with its libraries: ``librosa.load`` (mono, 22,050 Hz),
    ``librosa.feature.mfcc``, ``librosa.util.normalize(axis=1)``, ``fastdtw`` with SciPy's cosine
    distance per frame (radius 1)."""
    if not audio_path_1 or not audio_path_2:
        return 0.0
    require(_AUDIO, "compare_audios")
    import librosa
    from fastdtw import fastdtw
    from scipy.spatial.distance import cosine

    feats = []
    for path in (audio_path_1, audio_path_2):
        y, sr = librosa.load(path)
        feats.append(librosa.util.normalize(librosa.feature.mfcc(y=y, sr=sr), axis=1))
    distance, _path = fastdtw(feats[0].T, feats[1].T, dist=lambda x, y: cosine(x, y))
    return 1.0 / (1.0 + distance)


def _frames(path: str, limit: int) -> Iterator[Any]:
    """A video's first ``limit`` frames as RGB images: ``cv2.VideoCapture.read``, BGR to RGB, as
    OSWorld reads them."""
    import cv2
    from PIL import Image

    cap = cv2.VideoCapture(path)
    try:
        for _ in range(limit):
            ok, frame = cap.read()
            if not ok:
                return
            yield Image.fromarray(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    finally:
        cap.release()


def compare_videos(
    video_path1: str | None,
    video_path2: str | None,
    max_frames_to_check: int = 100,
    threshold: int = 5,
    **_: Any,
) -> float:
    """OSWorld's frame check: frame pairs whose perceptual hashes (``imagehash.phash``) differ by
    more than ``threshold`` bits are mismatches; more than ``threshold`` of them in the first
    ``max_frames_to_check`` -> 0.

    When one video ends first the score is whether both ended (so unequal lengths score 0 and
    equal-length videos 1 without the mismatch tally mattering), as there.
    """
    if not video_path1 or not video_path2:
        return 0.0
    require(_VIDEO, "compare_videos")
    import imagehash

    f1, f2 = _frames(video_path1, max_frames_to_check), _frames(video_path2, max_frames_to_check)
    mismatches = 0
    for _checked in range(max_frames_to_check):
        a, b = next(f1, None), next(f2, None)
        if a is None or b is None:
            return float(a is None and b is None)
        if imagehash.phash(a) - imagehash.phash(b) > threshold:
            mismatches += 1
            if mismatches > threshold:
                return 0.0
    return 1.0


# metric -> () -> why the task files cannot be scored here (None when they can)
BLOCKERS: dict[str, Callable[[], str | None]] = {"compare_audios": _AUDIO, "compare_videos": _VIDEO}

METRICS: dict[str, Callable[..., float]] = {
    "check_mp3_meta": check_mp3_meta,
    "compare_epub": compare_epub,
    "compare_audios": compare_audios,
    "compare_videos": compare_videos,
}
