"""Image parts through `rz serve` for a vision-language policy (a tiny Qwen3-VL made here): ``image_url``
data URIs on /v1/chat/completions and ``input_image`` on /v1/responses render as the template's image runs,
go to the engine with the request, and are recorded with the session, so the learner re-encodes the same
pixels and its log-probs of every sampled token equal the engine's (torch.equal; negative control: other
pictures give other log-probs). A text policy refuses image parts with one 400 line."""

from __future__ import annotations

import base64
import copy

import httpx
import numpy as np
import pytest
import torch
from serve_fixtures import MODEL, Served

from rz_agents.engine import EngineConfig, RZEngine
from rz_agents.images import from_png, to_png
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.rollout.byte_chat import ByteTokenizer
from rz_agents.rollout.byte_vl_chat import ByteVLChatTemplate
from rz_agents.runtime.factories import tiny_vl_config
from rz_agents.serve import OpenAIServer, ServeOptions, ServerThread
from rz_agents.trainer.sequence_logprobs import trajectory_logprobs

VISION = {"patch_size": 16, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "depth": 2,
          "deepstack_visual_indexes": [0]}  # fmt: skip
SCORING = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}


def _picture(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)


def _data_uri(picture: np.ndarray) -> str:
    return "data:image/png;base64," + base64.b64encode(to_png(picture)).decode()


PICTURES = [_picture(1), _picture(2)]


def _image(i: int) -> dict:
    return {"type": "image_url", "image_url": {"url": _data_uri(PICTURES[i])}}


def _input_image(i: int) -> dict:
    return {"type": "input_image", "image_url": _data_uri(PICTURES[i])}


class VLServed:
    def __init__(self) -> None:
        self.model = Qwen3VLModel(tiny_vl_config({"vocab_size": 320, "vision": VISION}), kernels="aligned")
        self.model.reset_parameters(seed=3)
        self.model.requires_grad_(False)
        self.template = ByteVLChatTemplate(self.model.vl_config)
        engine = RZEngine(copy.deepcopy(self.model), EngineConfig(max_running=4, max_len=320, num_threads=1))
        self.server = OpenAIServer(engine, ByteTokenizer(), self.template, model_name=MODEL)
        self.http = ServerThread(self.server, options=ServeOptions(session_records=True)).start()

    def post(self, path: str, body: dict, session: str | None = None) -> httpx.Response:
        headers = {"X-RZ-Session": session} if session else {}
        return httpx.post(f"{self.http.url}{path}", json=body, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def vl():
    s = VLServed()
    yield s
    s.http.stop()


def _chat_turns(vl: VLServed, session: str | None) -> list[dict]:
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, _image(0)]}]
    bodies = []
    for turn in range(2):
        r = vl.post("/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 6, "seed": turn,
                                          "return_token_ids": True}, session)  # fmt: skip
        assert r.status_code == 200, r.text
        body = r.json()
        bodies.append(body)
        more = {"role": "user", "content": [_image(1), {"type": "text", "text": "and?"}]}
        messages += [body["choices"][0]["message"], more]
    return bodies


def test_chat_image_parts_are_sampled_on_and_trained_exactly(vl):
    first, _ = _chat_turns(vl, "pictures")
    t = vl.template
    run = [t.vision_start_id, *[t.image_token_id] * 4, t.vision_end_id]  # 64 px, 16 px patches merged 2x2
    prompt = first["prompt_token_ids"]
    assert any(prompt[i : i + 6] == run for i in range(len(prompt)))
    traj = vl.server.sessions.sessions["pictures"].trajectory(reward=1.0, group_id=0)
    assert [np.asarray(from_png(p)).tolist() for p in traj.images] == [p.tolist() for p in PICTURES]
    assert traj.tokens.count(t.image_token_id) == 8 and traj.info["turns"] == 2
    mask = torch.tensor(traj.loss_mask[1:])
    behavior = torch.tensor(traj.behavior_logprobs[1:], dtype=torch.float32)[mask]
    (lp,) = trajectory_logprobs(vl.model, [traj], SCORING)
    assert mask.sum() > 2 and torch.equal(lp[mask], behavior)  # lag 0: the learner's log-probs, bit for bit
    traj.images = traj.images[::-1]  # negative control: the other pictures in their places
    (other,) = trajectory_logprobs(vl.model, [traj], SCORING)
    assert not torch.equal(other[mask], behavior)


def test_responses_input_images_give_the_tokens_of_the_chat_session(vl):
    _chat_turns(vl, "via-chat")
    items = [{"role": "user", "content": [{"type": "input_text", "text": "what is this?"}, _input_image(0)]}]
    for turn in range(2):
        r = vl.post("/responses", {"model": MODEL, "input": items, "max_output_tokens": 6, "seed": turn},
                    "via-responses")  # fmt: skip
        assert r.status_code == 200, r.text
        more = {"role": "user", "content": [_input_image(1), {"type": "input_text", "text": "and?"}]}
        items += [*r.json()["output"], more]
    sessions = vl.server.sessions.sessions
    a, b = sessions["via-chat"], sessions["via-responses"]
    assert a.tokens == b.tokens and a.images == b.images and b.prefix_mismatches == 0 and b.turns == 2


def test_stateless_chat_with_an_image_and_bad_image_parts(vl):
    _chat_turns(vl, None)
    for part, says in [
        ({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}, "data: URI"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "cannot be decoded"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,%%%"}}, "cannot be decoded"),
        ({"type": "image_url"}, "image_url"),
        ({"type": "input_audio"}, "only text and image_url"),
    ]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": [part]}], "max_tokens": 2}
        r = vl.post("/chat/completions", body)
        error = r.json()["error"]
        assert r.status_code == 400 and says in error["message"]
        assert error["param"] == "messages[0].content[0]"


@pytest.fixture(scope="module")
def text_policy():
    s = Served(taught=False)
    yield s
    s.stop()


def test_a_text_policy_refuses_image_parts_in_one_400_line(text_policy):
    root = text_policy.http.url
    seen = [{"role": "user", "content": [{"type": "text", "text": "see"}, _image(0)]}]
    chat = {"model": MODEL, "max_tokens": 2, "messages": seen}
    responses = {
        "model": MODEL,
        "max_output_tokens": 2,
        "input": [{"role": "user", "content": [_input_image(0)]}],
    }
    for path, body in (("/chat/completions", chat), ("/responses", responses)):
        r = httpx.post(f"{root}{path}", json=body, timeout=60)
        error = r.json()["error"]
        assert r.status_code == 400 and error["code"] == "images_not_supported"
        assert "\n" not in error["message"] and "takes no images" in error["message"]
    assert text_policy.server.metrics()["sessions_open"] == 0


def test_an_osworld_prompt_agent_screenshot_payload_is_answered(vl):
    """The shape OSWorld's PromptAgent posts (system text parts; the screenshot as an image_url with
    ``detail``; max_tokens, top_p, temperature), with a picture small enough for the tiny policy."""
    screenshot = {"type": "image_url", "image_url": {"url": _data_uri(PICTURES[0]), "detail": "high"}}
    ask = "Given the screenshot as below. What's the next step that you will do to help with the task?"
    payload = {
        "model": MODEL, "max_tokens": 8, "top_p": 0.9, "temperature": 0.5,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "You are an agent on a desktop."}]},
            {"role": "user", "content": [{"type": "text", "text": ask}, screenshot]},
        ],
    }  # fmt: skip
    r = vl.post("/chat/completions", {**payload, "return_token_ids": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert body["usage"]["completion_tokens"] > 0
    assert body["prompt_token_ids"].count(vl.template.image_token_id) == 4
