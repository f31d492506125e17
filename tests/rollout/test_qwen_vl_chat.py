"""QwenVLChatTemplate: with the real Qwen tokenizer, conversations with images render as Qwen3-VL's official
chat template and processor render them together (transformers' own Qwen3VLProcessor on real images): the
same input_ids, one <|image_pad|> per merged patch, and the same pixel_values for the engine's request.
Text-only conversations render unchanged, continuations stay append-only, and a tiny random-init Qwen3-VL
with the Qwen vocabulary samples VisualClick episodes from these prompts and trains on them with lag-0
log-probs exactly the engine's."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch

from rz_agents.images import from_png, image_part, message_images, text_part, to_png
from rz_agents.model.chat_template import (
    QWEN3_CHAT_TEMPLATE,
    QWEN3_INSTRUCT_2507_CHAT_TEMPLATE,
    ChatTemplate,
    thinking_style,
)
from rz_agents.model.qwen3_vl import Qwen3VLModel
from rz_agents.rollout.qwen_vl_chat import QwenVLChatTemplate
from rz_agents.runtime.factories import policy_template, tiny_vl_config

transformers = pytest.importorskip("transformers")
Image = pytest.importorskip("PIL.Image")
ImageDraw = pytest.importorskip("PIL.ImageDraw")

SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "inspector.png"  # a real UI screenshot
VISION = {"patch_size": 16, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "depth": 2,
          "deepstack_visual_indexes": [0]}  # fmt: skip

# Qwen3-VL-Instruct's official chat template (the `chat_template` of Qwen/Qwen3-VL-8B-Instruct, as quoted
# verbatim in public repositories found with the code search; its UTF-8 bytes hash to 3636d0f0...e4). Used
# only here, as the reference our Python rendering is checked against.
OFFICIAL_QWEN3_VL_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""  # noqa: E501

TOOLS = [{"type": "function", "function": {"name": "click", "description": "Click a point.", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}}}]  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer():
    from rz_agents.model.tokenizer import qwen3_tokenizer

    return qwen3_tokenizer()


@pytest.fixture(scope="module")
def vl_config(tokenizer):
    return tiny_vl_config({"vocab_size": len(tokenizer), "vision": VISION})


@pytest.fixture(scope="module")
def processor(tokenizer, vl_config, monkeypatch_module):
    """transformers' Qwen3VLProcessor with the official template, our tower's patch/merge sizes and the
    pixel bounds model/vl_processor.py preprocesses with, over the Qwen tokenizer."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.processing_utils import ProcessorMixin

    # transformers' argument class check looks classes up in its video-processor registry, which is a
    # placeholder without torchvision (not installed here); the processor itself needs no torchvision
    monkeypatch_module.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, n, a: type(a))
    vision = vl_config.vision
    images = Qwen2VLImageProcessorPil(
        patch_size=vision.patch_size,
        temporal_patch_size=vision.temporal_patch_size,
        merge_size=vision.spatial_merge_size,
        size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 1280},
    )
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    return transformers.Qwen3VLProcessor(
        image_processor=images, tokenizer=fast, video_processor=Qwen3VLVideoProcessor(),
        chat_template=OFFICIAL_QWEN3_VL_TEMPLATE,
    )  # fmt: skip


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def _drawing(w: int, h: int, fill: str):
    im = Image.new("RGB", (w, h), (250, 250, 240))
    d = ImageDraw.Draw(im)
    d.rectangle([3, 4, w // 2, h // 2], fill=fill)
    d.ellipse([w // 3, h // 3, w - 2, h - 2], outline="black", width=2)
    return im


def _conversations():
    """Conversations with images: a screenshot and drawings of other sizes, in user and tool turns."""
    shot = Image.open(SCREENSHOT).convert("RGB")
    small, tall = _drawing(70, 45, "red"), _drawing(40, 96, "blue")
    agent = [
        {"role": "system", "content": "You operate a desktop."},
        {
            "role": "user",
            "content": [text_part("Given the screenshot as below. Next step?"), image_part(shot)],
        },
        {"role": "assistant", "content": "```python\npyautogui.click(10, 20)\n```"},
        {"role": "user", "content": [image_part(small), text_part("and this one: "), image_part(tall)]},
    ]
    tools = [
        {"role": "user", "content": [text_part("Click the red box."), image_part(small)]},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"name": "click", "arguments": {"x": 5, "y": 6}}],
        },
        {"role": "tool", "content": [text_part("clicked; the screen now:"), image_part(tall)]},
    ]
    return [("agent", agent, None), ("tools", tools, TOOLS)]


def test_the_official_template_is_a_non_thinking_one():
    # so its text is what QWEN3_INSTRUCT_2507_CHAT_TEMPLATE renders (template_for picks it from the jinja)
    assert thinking_style(OFFICIAL_QWEN3_VL_TEMPLATE) == "never"


def test_image_conversations_tokenize_as_transformers_qwen3_vl_processor(tokenizer, vl_config, processor):
    template = QwenVLChatTemplate.of(QWEN3_INSTRUCT_2507_CHAT_TEMPLATE, vl_config)
    for name, messages, tools in _conversations():
        ours = template.encode_prompt(tokenizer, messages, tools=tools)
        ref = processor.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=True,
            return_tensors="pt",
        )  # fmt: skip
        assert ours == ref["input_ids"][0].tolist(), name
        # one <|image_pad|> per merged patch of each image, in order, between the vision brackets
        grids = ref["image_grid_thw"]
        pads = ours.count(vl_config.image_token_id)
        assert pads == int(grids.prod(-1).sum()) // vl_config.vision.spatial_merge_size**2 > 0
        assert ours.count(vl_config.vision_start_token_id) == len(grids) == len(message_images(messages))
        # the engine's request of the trajectory's PNGs: the processor's own pixels and grids
        request = template.image_prompt([to_png(im) for im in message_images(messages)])
        assert torch.equal(torch.as_tensor(request.image_grid_thw), grids), name
        assert torch.equal(request.pixel_values, ref["pixel_values"]), name
    assert len({tuple(g) for g in grids.tolist()}) == 2  # images of different sizes: different runs


def test_text_only_conversations_render_unchanged(tokenizer, vl_config, processor):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "tool_calls": [{"name": "click", "arguments": {"x": 1}}]},
        {"role": "tool", "content": "ok"},
    ]
    assert hash(QwenVLChatTemplate.of(QWEN3_CHAT_TEMPLATE, vl_config))  # usable like the base templates
    bases = (QWEN3_CHAT_TEMPLATE, QWEN3_INSTRUCT_2507_CHAT_TEMPLATE, ChatTemplate(default_system_prompt="S"))
    for base in bases:
        vl = QwenVLChatTemplate.of(base, vl_config)
        for tools in (None, TOOLS):
            assert vl.render(messages, tools=tools) == base.render(messages, tools=tools)
            ids = vl.encode_prompt(tokenizer, messages, tools)
            assert ids == base.encode_prompt(tokenizer, messages, tools)
    official = processor.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    ours = QwenVLChatTemplate.of(QWEN3_INSTRUCT_2507_CHAT_TEMPLATE, vl_config).render(messages, TOOLS)
    assert ours == official


def test_image_turns_continue_append_only(tokenizer, vl_config):
    template = QwenVLChatTemplate.of(QWEN3_INSTRUCT_2507_CHAT_TEMPLATE, vl_config)
    (_, messages, _), _ = _conversations()
    head, reply, obs = messages[:2], messages[2]["content"], messages[3:]
    prompt = template.encode_prompt(tokenizer, head)
    tokens = prompt + tokenizer.encode(reply) + [tokenizer.token_to_id("<|im_end|>")]
    tokens += template.encode_continuation(tokenizer, obs)
    assert tokens == template.encode_prompt(tokenizer, messages)


def test_images_the_official_template_drops_and_a_foreign_tokenizer_are_refused(tokenizer, vl_config):
    template = QwenVLChatTemplate.of(QWEN3_CHAT_TEMPLATE, vl_config)
    image = _drawing(40, 40, "red")
    for role in ("system", "assistant"):
        with pytest.raises(ValueError, match=rf"message 0 \({role}\) content\[1\] is an image"):
            template.render([{"role": role, "content": [text_part("a"), image_part(image)]}])
    with pytest.raises(ValueError, match=r"content\[0\] is not a text or image part"):
        template.render([{"role": "user", "content": [{"type": "audio"}]}])
    byte_model = QwenVLChatTemplate.of(QWEN3_CHAT_TEMPLATE, tiny_vl_config({"vocab_size": 320}))
    with pytest.raises(ValueError, match="tokenizer's <.vision_start.> is id 151652 but the model's is 302"):
        byte_model.encode_prompt(tokenizer, [{"role": "user", "content": "hi"}])


def test_a_qwen_vocabulary_vl_policy_samples_and_trains_on_these_prompts_lag0_exact(tokenizer, vl_config):
    from rz_agents.engine import EngineConfig, RZEngine, SamplingParams
    from rz_agents.envs.visual_click import VisualClickEnv
    from rz_agents.rollout.agent_loop import EpisodeLimits, EpisodeSpec, run_episode
    from rz_agents.trainer.learner import Learner, LearnerConfig
    from rz_agents.trainer.optim import OptimConfig

    model = Qwen3VLModel(vl_config, kernels="aligned")
    model.reset_parameters(seed=3)
    template = policy_template(QWEN3_INSTRUCT_2507_CHAT_TEMPLATE, model.vl_config)
    assert isinstance(template, QwenVLChatTemplate) and template.thinking == "never"
    engine = RZEngine(
        copy.deepcopy(model).requires_grad_(False), EngineConfig(max_running=2, max_len=512, num_threads=1)
    )
    limits = EpisodeLimits(max_turns=1, max_tokens_per_turn=4, max_episode_tokens=500)

    async def go():
        return await asyncio.gather(*(
            run_episode(
                engine, VisualClickEnv(n_buttons=2), template, tokenizer,
                EpisodeSpec(task={"split": "train", "index": 0}, group_id=0, member=i, seed=i),
                SamplingParams(), limits,
            )
            for i in range(2)
        ))  # fmt: skip

    trajs = asyncio.run(go())
    for t in trajs:  # 64 px pictures, 16 px patches merged 2x2: 4 placeholders
        assert len(t.images) == 1 and from_png(t.images[0]).size == (64, 64)
        i = t.tokens.index(template.vl_config.vision_start_token_id)
        assert t.tokens[i : i + 6] == [151652, *[151655] * 4, 151653]
        t.reward = float(t.info["member"])
    # the second member shares the first one's prompt pages, the picture's placeholders included
    assert engine.stats()["images_encoded"] == 1 and engine.stats()["images_prefix_reused"] == 1
    cfg = LearnerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0), assert_lag0_exact=True)
    metrics = Learner(model, cfg).step(trajs)
    assert metrics["lag0_abs_dlogp_max"] == 0.0 and metrics["lag0_token_count"] == 8
