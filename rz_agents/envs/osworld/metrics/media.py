"""Media and e-book metrics: MP3 tags, EPUB books, audio and video similarity.

``check_mp3_meta`` and ``compare_epub`` follow OSWorld's ``metrics/others.py``; ``compare_audios``
and ``compare_videos`` its ``metrics/vlc.py``. OSWorld computes audio similarity with librosa
(MFCCs, fastdtw) and video similarity with OpenCV and imagehash, none of which this machine has:
here librosa's MFCC definition and imagehash's pHash are written out; audio is read from WAV
files (scipy) or decoded by ffmpeg (the tasks' MP3), frames come from a folder of images or are
decoded by ffmpeg (the tasks' MP4). Without ffmpeg ``BLOCKERS`` says so and ``rz osworld
validate`` reports it.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from typing import Any

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


def _probe(path: str, stream: str, entries: str) -> dict[str, Any]:
    """``ffprobe``'s fields of the first ``stream`` (``a`` audio, ``v`` video) of a media file."""
    import json
    import subprocess

    r = subprocess.run(
        ["ffprobe", "-v", "error", "-select_streams", f"{stream}:0", "-show_entries", f"stream={entries}",
         "-of", "json", path],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    streams = json.loads(r.stdout or "{}").get("streams") if r.returncode == 0 else None
    if not streams:
        raise RuntimeError(f"ffprobe found no {'audio' if stream == 'a' else 'video'} stream in {path}")
    return streams[0]


def _decode_audio(path: str) -> tuple[int, Any]:
    """(rate, float samples, channels last) of any file ffmpeg reads, at its own rate and channels."""
    import subprocess

    import numpy as np

    info = _probe(path, "a", "sample_rate,channels")
    rate, channels = int(info["sample_rate"]), int(info["channels"])
    r = subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-i", path, "-map", "0:a:0", "-f", "f32le", "-acodec", "pcm_f32le", "-"],
        capture_output=True, timeout=300,
    )  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"ffmpeg could not decode {path}: {r.stderr.decode(errors='replace')[-300:]}")
    x = np.frombuffer(r.stdout, dtype=np.float32).astype(np.float64)
    return rate, x[: len(x) // channels * channels].reshape(-1, channels)


def _load_audio(path: str, sr: int = 22050) -> Any:
    """Mono float samples at ``sr`` (librosa.load's defaults: channels averaged, resampled).

    WAV through scipy; anything else (the tasks' MP3) decoded by ffmpeg at its own rate and
    channels, then the same averaging and resampling (librosa resamples with soxr, here a
    polyphase filter: scores can differ in the last digits).
    """
    import numpy as np
    from scipy.signal import resample_poly

    if str(path).lower().endswith(".wav"):
        from scipy.io import wavfile

        rate, data = wavfile.read(path)
        x = data.astype(np.float64)
        if np.issubdtype(data.dtype, np.integer):
            x /= float(np.iinfo(data.dtype).max) + 1.0
    else:
        problem = _audio_blocker()
        if problem:
            raise RuntimeError(f"compare_audios: {problem} ({path})")
        rate, x = _decode_audio(str(path))
    if x.ndim == 2:
        x = x.mean(axis=1)
    if rate != sr:
        from math import gcd

        g = gcd(rate, sr)
        x = resample_poly(x, sr // g, rate // g)
    return x


def _mel_filters(sr: int, n_fft: int, n_mels: int) -> Any:
    """librosa.filters.mel defaults: Slaney mel scale, Slaney area normalisation."""
    import numpy as np

    def hz_to_mel(f: Any) -> Any:
        f = np.asanyarray(f, dtype=float)
        mel = f / (200.0 / 3)
        log_region = f >= 1000.0
        return np.where(log_region, 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0), mel)

    def mel_to_hz(m: Any) -> Any:
        m = np.asanyarray(m, dtype=float)
        return np.where(m >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (m - 15.0)), m * (200.0 / 3))

    fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    mel_f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(sr / 2.0), n_mels + 2))
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels]))[:, None]


def mfcc(
    y: Any, sr: int = 22050, n_mfcc: int = 20, n_fft: int = 2048, hop: int = 512, n_mels: int = 128
) -> Any:
    """librosa.feature.mfcc's defaults: centred Hann STFT (constant padding), power mel spectrogram,
    ``power_to_db`` (ref 1, amin 1e-10, top_db 80), orthonormal DCT-II; shape (n_mfcc, frames)."""
    import numpy as np
    from scipy.fft import dct

    y = np.pad(y, n_fft // 2, mode="constant")
    frames = 1 + (len(y) - n_fft) // hop
    window = np.hanning(n_fft + 1)[:-1]
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    power = np.abs(np.fft.rfft(y[idx] * window, axis=1)).T ** 2
    mel = _mel_filters(sr, n_fft, n_mels) @ power
    db = 10.0 * np.log10(np.maximum(1e-10, mel))
    db = np.maximum(db, db.max() - 80.0)
    return dct(db, axis=0, type=2, norm="ortho")[:n_mfcc]


def _normalize_rows(m: Any) -> Any:
    """librosa.util.normalize(axis=1): each coefficient's track divided by its max magnitude."""
    import numpy as np

    peak = np.abs(m).max(axis=1, keepdims=True)
    return np.where(peak > 0, m / np.where(peak > 0, peak, 1), m)


def _cosine(u: Any, v: Any) -> float:
    import numpy as np

    return float(1.0 - np.dot(u, v) / (np.linalg.norm(u) * np.linalg.norm(v)))


def _dtw(
    x: Any, y: Any, window: Any, dist: Callable[[Any, Any], float]
) -> tuple[float, list[tuple[int, int]]]:
    """DTW over the cells in ``window`` (None: all), fastdtw's recurrence and tie order."""
    inf = float("inf")
    cells = window if window is not None else [(i, j) for i in range(len(x)) for j in range(len(y))]
    d: dict[tuple[int, int], tuple[float, int, int]] = {(-1, -1): (0.0, 0, 0)}
    for i, j in cells:
        cost = dist(x[i], y[j])
        d[(i, j)] = min(
            (d.get((i - 1, j), (inf,))[0] + cost, i - 1, j),
            (d.get((i, j - 1), (inf,))[0] + cost, i, j - 1),
            (d.get((i - 1, j - 1), (inf,))[0] + cost, i - 1, j - 1),
            key=lambda a: a[0],
        )
    path, i, j = [], len(x) - 1, len(y) - 1
    while (i, j) != (-1, -1):
        path.append((i, j))
        i, j = d[(i, j)][1], d[(i, j)][2]
    return d[(len(x) - 1, len(y) - 1)][0], path[::-1]


def fastdtw(x: Any, y: Any, dist: Callable[[Any, Any], float], radius: int = 1) -> tuple[float, list]:
    """Salvador & Chan's FastDTW (the ``fastdtw`` package's algorithm): coarsen by 2, recurse,
    project the path and search within ``radius``."""
    min_size = radius + 2
    if len(x) < min_size or len(y) < min_size:
        return _dtw(x, y, None, dist)
    shrink = lambda s: [(s[i] + s[i + 1]) / 2 for i in range(0, len(s) - len(s) % 2, 2)]  # noqa: E731
    _, path = fastdtw(shrink(x), shrink(y), dist, radius)
    window = _expand_window(path, len(x), len(y), radius)
    return _dtw(x, y, window, dist)


def _expand_window(path: list[tuple[int, int]], len_x: int, len_y: int, radius: int) -> list[tuple[int, int]]:
    path_ = set(path)
    for i, j in path:
        for a in range(-radius, radius + 1):
            for b in range(-radius, radius + 1):
                path_.add((i + a, j + b))
    window_ = set()
    for i, j in path_:
        for a, b in ((i * 2, j * 2), (i * 2, j * 2 + 1), (i * 2 + 1, j * 2), (i * 2 + 1, j * 2 + 1)):
            window_.add((a, b))
    window, start_j = [], 0
    for i in range(len_x):
        new_start_j = None
        for j in range(start_j, len_y):
            if (i, j) in window_:
                window.append((i, j))
                if new_start_j is None:
                    new_start_j = j
            elif new_start_j is not None:
                break
        start_j = new_start_j if new_start_j is not None else start_j
    return window


def compare_audios(audio_path_1: str | None, audio_path_2: str | None, **_: Any) -> float:
    """``1 / (1 + DTW distance)`` between the two files' row-normalised MFCC sequences (cosine
    distance per frame, FastDTW radius 1), as OSWorld (commit 8942695) computes it. WAV, or any
    format ffmpeg decodes (see ``BLOCKERS``)."""
    if not audio_path_1 or not audio_path_2:
        return 0.0
    import numpy as np

    feats = [_normalize_rows(mfcc(_load_audio(path))).T for path in (audio_path_1, audio_path_2)]
    distance, _ = fastdtw(list(np.asarray(feats[0])), list(np.asarray(feats[1])), _cosine, radius=1)
    return 1.0 / (1.0 + distance)


# --- video -----------------------------------------------------------------------------------


def _phash(img: Any) -> Any:
    """imagehash.phash: 32x32 greyscale (Lanczos), 2-D DCT-II, top-left 8x8 above its median."""
    import numpy as np
    from PIL import Image
    from scipy.fft import dct

    pixels = np.asarray(img.convert("L").resize((32, 32), Image.Resampling.LANCZOS), dtype=float)
    low = dct(dct(pixels, axis=0), axis=1)[:8, :8]
    return low > np.median(low)


def _frames(path: str, limit: int) -> Iterator[Any]:
    """A video's first ``limit`` frames as RGB images, in decoding order.

    A folder of still images (sorted by name), or a video file decoded by ffmpeg as OpenCV's
    ``VideoCapture.read`` gives it (every decoded frame, none repeated or dropped; OSWorld then
    converts BGR to RGB), streamed one frame at a time.
    """
    import os

    from PIL import Image

    if os.path.isdir(path):
        for name in sorted(os.listdir(path))[:limit]:
            yield Image.open(os.path.join(path, name))
        return
    problem = _video_blocker()
    if problem:
        raise RuntimeError(f"compare_videos: {problem} ({path})")
    yield from _decode_video(path, limit)


def _decode_video(path: str, limit: int) -> Iterator[Any]:
    import subprocess

    from PIL import Image

    info = _probe(path, "v", "width,height")
    w, h = int(info["width"]), int(info["height"])
    proc = subprocess.Popen(
        ["ffmpeg", "-v", "error", "-nostdin", "-i", path, "-map", "0:v:0", "-fps_mode", "passthrough",
         "-frames:v", str(limit), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        size = w * h * 3
        while True:
            buf = proc.stdout.read(size)
            if len(buf) < size:
                return
            yield Image.frombytes("RGB", (w, h), buf)
    finally:
        proc.kill()
        proc.wait()


def compare_videos(
    video_path1: str | None,
    video_path2: str | None,
    max_frames_to_check: int = 100,
    threshold: int = 5,
    **_: Any,
) -> float:
    """OSWorld's frame check: frame pairs whose perceptual hashes differ by more than ``threshold``
    bits are mismatches; more than ``threshold`` of them in the first ``max_frames_to_check`` -> 0.

    When one video ends first the score is whether both ended (so unequal lengths score 0 and
    equal-length videos 1 without the mismatch tally mattering), as there.
    """
    if not video_path1 or not video_path2:
        return 0.0
    f1, f2 = _frames(video_path1, max_frames_to_check), _frames(video_path2, max_frames_to_check)
    mismatches = 0
    for _checked in range(max_frames_to_check):
        a, b = next(f1, None), next(f2, None)
        if a is None or b is None:
            return float(a is None and b is None)
        if int((_phash(a) != _phash(b)).sum()) > threshold:
            mismatches += 1
            if mismatches > threshold:
                return 0.0
    return 1.0


def _ffmpeg_missing() -> bool:
    import shutil

    return not (shutil.which("ffmpeg") and shutil.which("ffprobe"))


def _audio_blocker() -> str | None:
    if _ffmpeg_missing():
        return "the task's audio is MP3: decoding it needs ffmpeg (apt-get install ffmpeg; WAV files only without)"
    return None


def _video_blocker() -> str | None:
    if _ffmpeg_missing():
        return "the task's video is MP4: decoding it needs ffmpeg (apt-get install ffmpeg; frame folders only without)"
    return None


# metric -> () -> why the task files cannot be scored here (None when they can)
BLOCKERS: dict[str, Callable[[], str | None]] = {
    "compare_audios": _audio_blocker,
    "compare_videos": _video_blocker,
}

METRICS: dict[str, Callable[..., float]] = {
    "check_mp3_meta": check_mp3_meta,
    "compare_epub": compare_epub,
    "compare_audios": compare_audios,
    "compare_videos": compare_videos,
}
