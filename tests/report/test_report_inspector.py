"""The trajectory inspector page, rendered in headless Chromium; report numbers as readable tables."""

import io
import math
import shutil
import subprocess

import pytest

from rz_agents.model import ModelConfig, Transformer
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.model.qwen3_vl_config import Qwen3VLConfig
from rz_agents.report.inspector import write_inspector
from rz_agents.report.tables import fmt_number, value_html
from rz_agents.rollout.byte_chat import IM_END, IM_START, ByteTokenizer
from rz_agents.sampling import SamplingSpec
from rz_agents.trainer.inspect import inspected_steps, record_step, write_step_record
from rz_agents.trainer.learner import LearnerConfig
from rz_agents.trajectory import Trajectory


def _episode(group, reward, advantage, logp_shift, lag):
    text = list("<|user|>What is 6*7?\n") + list("<tool_call>print(6*7)</tool_call>") + list("\n42\n")
    text += list("The answer is \\boxed{42}.")
    prompt, call, tool = 21, 34, 4
    mask = [False] * prompt + [True] * call + [False] * tool + [True] * (len(text) - prompt - call - tool)
    behavior = [-0.5 if m else 0.0 for m in mask]
    learner = [math.nan] + [
        b + (logp_shift if m else 0.0) for b, m in zip(behavior[1:], mask[1:], strict=True)
    ]
    return {
        "group_id": group,
        "reward": reward,
        "advantage": advantage,
        "info": {"turns": 2, "finish": "terminated"},
        "tokens": [ord(c) for c in text],
        "pieces": text,
        "loss_mask": mask,
        "versions": [3 - lag if m else -1 for m in mask],
        "behavior_logprobs": behavior,
        "learner_logprobs": learner,
    }


def test_steps_to_inspect_count_from_the_end_when_negative():
    assert inspected_steps([0, -1], 30) == {0, 29}
    assert inspected_steps([5, -40], 30) == {5}


def test_summary_values_become_rounded_numbers_and_nested_tables():
    assert (
        fmt_number(0.123456789) == "0.1235"
        and fmt_number(2602.4) == "2602"
        and fmt_number(1234567.0) == "1,234,567"
    )
    assert (
        fmt_number(4.76837158203125e-07) == "4.77e-07" and fmt_number(None) == "—" and fmt_number(12) == "12"
    )
    table = value_html(
        {"rollout": {"episodes_finished": 64, "failed": 0}, "reward_per_step": [0.1234567, 0.5]}
    )
    assert "<th>rollout</th><td><table><tr><th>episodes_finished</th><td>64</td>" in table
    assert "<td>0.1235, 0.5</td>" in table


def test_inspector_page_renders_in_headless_chromium(tmp_path):
    episodes = [
        _episode(0, 1.0, 0.5, 0.0, 0),
        _episode(0, 0.0, -0.5, 0.04, 1),
        _episode(1, 1.0, 0.0, -0.3, 2),
    ]
    write_step_record(tmp_path / "inspect", 7, {"version": 3, "max_lag": 64, "episodes": episodes})
    page = write_inspector(tmp_path)
    text = page.read_text()
    assert text.count('<div class="ep">') == 3 and "Learner step 7 (version 3)" in text
    assert 'class="tok l1"' in text and 'class="tok l2"' in text  # lag 1 and lag 2 underlines
    assert "background:#ffffff" in text and "rgba(214,39,40" in text and "rgba(31,119,180" in text
    assert "w 1.04081 · logp -0.46 · behavior -0.5" in text  # a token's tooltip
    assert "<script" not in text  # static: nothing runs
    pixels = _screenshot(page, tmp_path / "inspector.png", (1200, 700))  # RGBA floats in [0, 1]
    assert pixels.shape[:2] == (700, 1200)
    red = (pixels[..., 0] > 0.75) & (pixels[..., 2] < 0.7)  # tokens with a weight above 1
    blue = (pixels[..., 2] > 0.6) & (pixels[..., 0] < 0.5)  # below 1
    assert red.sum() > 200 and blue.sum() > 200


def _trajectory(tokens: list[int], images: list[bytes] | None = None) -> Trajectory:
    n = len(tokens)
    return Trajectory(tokens, [False] * (n - 1) + [True], [0.0] * (n - 1) + [-1.0], [-1] * (n - 1) + [0],
                      1.0, 0, images=images or [])  # fmt: skip


def _record(model, tokens: list[int], images: list[bytes] | None = None) -> dict:
    traj = _trajectory(tokens, images)
    decode = ByteTokenizer().decode
    return record_step(model, [traj], LearnerConfig(), 0, lambda t: decode([t]), sampling=SamplingSpec(),
                       max_lag=None)  # fmt: skip


def test_vision_ids_of_the_byte_tokenizer_show_their_names_and_unknown_ids_their_number(tmp_path):
    model = Qwen3VLModel(Qwen3VLConfig.tiny())  # a byte-tokenizer VL run's ids: 300-303 (bytes end at 258)
    tokens = [IM_START, *b"user\n", 302, 300, 300, 303, 301, IM_END, 310, *b"ok"]
    record = _record(model, tokens)
    assert record["episodes"][0]["pieces"] == [
        "<|im_start|>", "u", "s", "e", "r", "\n", "<|vision_start|>", "<|image_pad|>", "<|image_pad|>",
        "<|vision_end|>", "<|video_pad|>", "<|im_end|>", "<id 310>", "o", "k",
    ]  # fmt: skip
    assert ByteTokenizer().decode([300]) == ""  # what the inspector showed for them before: nothing
    write_step_record(tmp_path / "inspect", 0, record)
    assert "&lt;|image_pad|&gt;" in write_inspector(tmp_path).read_text()
    # A text model gives the same ids no meaning: they show their number.
    text_pieces = _record(Transformer(ModelConfig.tiny("qwen3")), [IM_START, 300, 302, *b"ok"])["episodes"][0]
    assert text_pieces["pieces"][1:3] == ["<id 300>", "<id 302>"]


def test_a_vision_language_episode_is_scored_with_its_images_as_the_learner_scores_it():
    from PIL import Image

    from rz_agents.model.logprobs import packed_token_logprobs
    from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate
    from rz_agents.trainer.sequence_logprobs import trajectory_logprobs

    model = Qwen3VLModel(Qwen3VLConfig.tiny())
    image, picture = Image.new("RGB", (64, 48), (200, 30, 30)), io.BytesIO()
    image.save(picture, format="PNG")
    png = picture.getvalue()
    tokens = [IM_START, *b"user\n", *ByteVLChatTemplate(model.vl_config).image_tokens(image), IM_END, *b"ok"]
    learner = _record(model, tokens, [png])["episodes"][0]["learner_logprobs"][1:]
    assert learner == trajectory_logprobs(model, [_trajectory(tokens, [png])], {})[0].tolist()
    # control: the same tokens without the image (what the inspector scored before) give other numbers
    assert learner != packed_token_logprobs(model, [tokens])[0].tolist()


def test_inspector_opens_on_the_last_step_with_groups_that_taught_something_first(tmp_path):
    uniform, taught = [_episode(5, 1.0, 0.0, 0.0, 0)] * 2, [_episode(6, 1.0, 0.5, 0.0, 0)]
    for step in (2, 10):  # (step_10.json sorts before step_2.json by name)
        write_step_record(
            tmp_path / "inspect", step, {"version": step, "max_lag": 1, "episodes": uniform + taught}
        )
    text = write_inspector(tmp_path).read_text()
    assert text.index("Learner step 10") < text.index("Learner step 2")
    last = text[text.index("Learner step 10") : text.index("Learner step 2")]
    assert last.index("<details open><summary>group 6") < last.index("<details><summary>group 5")


def _png(color: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return buffer.getvalue()


def _screenshot(page, out, size=(1200, 900)):
    """``page`` rendered by headless Chromium: its pixels (RGBA floats), or a skip without Chromium."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium")
    subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={out}",
         f"--window-size={size[0]},{size[1]}", page.as_uri()],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    from matplotlib.image import imread

    return imread(out)


def test_a_vision_language_episode_shows_its_images_where_the_template_placed_them(tmp_path):
    from PIL import Image

    from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate

    model = Qwen3VLModel(Qwen3VLConfig.tiny())
    template = ByteVLChatTemplate(model.vl_config)
    green, magenta = _png((20, 200, 40)), _png((230, 20, 230), (96, 64))
    first = template.image_tokens(Image.open(io.BytesIO(green)))
    second = template.image_tokens(Image.open(io.BytesIO(magenta)))
    tokens = [IM_START, *b"user\n", *first, *b"then", *second, IM_END, *b"ok"]
    record = _record(model, tokens, [green, magenta])
    episode = record["episodes"][0]
    pad_start = 6 + 1  # <|im_start|>user\n, <|vision_start|>
    assert episode["image_at"] == [pad_start, pad_start + len(first) + 4]
    write_step_record(tmp_path / "inspect", 0, record)
    write_step_record(tmp_path / "inspect", 1, record)  # the same screenshots at a later step: stored once
    stored = sorted((tmp_path / "inspect" / "images").iterdir())
    assert len(stored) == 2 and {p.read_bytes() for p in stored} == {green, magenta}
    page = write_inspector(tmp_path)
    text = page.read_text()
    step_1 = text[text.index("Learner step 1") : text.index("Learner step 0")]
    sources = [s.split('"')[0] for s in step_1.split('<img class="obs" src="')[1:]]
    assert [(tmp_path / s).read_bytes() for s in sources] == [green, magenta]  # in the tokens' order
    between = step_1[step_1.index(sources[0]) : step_1.index(sources[1])]
    assert ">t</span>" in between and ">h</span>" in between  # the text between the two pictures
    assert f"&lt;|image_pad|&gt;×{len(first) - 2}" in step_1  # the placeholder run folded into one token
    pixels = _screenshot(page, tmp_path / "inspector.png")
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    assert ((g > 0.7) & (r < 0.2) & (b < 0.3)).sum() > 1000  # the green picture, drawn on the page
    assert ((r > 0.8) & (b > 0.8) & (g < 0.2)).sum() > 1000  # and the magenta one


def test_images_that_do_not_match_the_placeholders_are_shown_above_the_tokens(tmp_path):
    from rz_agents.trainer.inspect import image_positions

    pieces = ["<|im_start|>", "u", "<|vision_start|>", "<|image_pad|>", "<|image_pad|>", "<|vision_end|>"]
    mask = [False] * 6
    assert image_positions(pieces, mask, 1) == [3]
    assert image_positions(pieces, mask, 2) == []  # two images, one run: where each sits is unknown
    assert image_positions([*pieces, "<|image_pad|>"], [*mask, True], 1) == [3]  # a sampled one is no image
    episode = dict(_episode(0, 1.0, 0.5, 0.0, 0), images=[_png((200, 30, 30))], image_at=[])
    write_step_record(tmp_path / "inspect", 0, {"version": 3, "max_lag": 64, "episodes": [episode]})
    text = write_inspector(tmp_path).read_text()
    assert text.count('<img class="obs"') == 1 and '<div class="tokens"><a href="inspect/images/' in text
